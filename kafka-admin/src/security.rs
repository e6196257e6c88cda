//! How asyncd's Kafka clients authenticate and encrypt: TLS and SASL (SCRAM or PLAIN)
//! settings, read from `ASYNCD_KAFKA_*` environment variables and handed to librdkafka
//! unchanged by every client the process makes (producer, consumers, topic admin).
//!
//! Only environment variables and files, never flags: the password would otherwise be in
//! every `ps` listing. The password comes from `ASYNCD_KAFKA_SASL_PASSWORD` or from the
//! file `ASYNCD_KAFKA_SASL_PASSWORD_FILE` names (a mounted Secret key), and never appears
//! in `Debug` output or in errors.

use std::path::PathBuf;

use rdkafka::ClientConfig;

/// The variables, and the librdkafka property each one sets.
const PROTOCOL: (&str, &str) = ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "security.protocol");
const MECHANISM: (&str, &str) = ("ASYNCD_KAFKA_SASL_MECHANISM", "sasl.mechanism");
const USERNAME: (&str, &str) = ("ASYNCD_KAFKA_SASL_USERNAME", "sasl.username");
const PASSWORD: (&str, &str) = ("ASYNCD_KAFKA_SASL_PASSWORD", "sasl.password");
const PASSWORD_FILE: &str = "ASYNCD_KAFKA_SASL_PASSWORD_FILE";
const SSL_FILES: [(&str, &str); 3] = [
    ("ASYNCD_KAFKA_SSL_CA_LOCATION", "ssl.ca.location"),
    (
        "ASYNCD_KAFKA_SSL_CERTIFICATE_LOCATION",
        "ssl.certificate.location",
    ),
    ("ASYNCD_KAFKA_SSL_KEY_LOCATION", "ssl.key.location"),
];

/// Every variable [`KafkaSecurity::from_lookup`] reads.
pub const VARIABLES: [&str; 8] = [
    PROTOCOL.0,
    MECHANISM.0,
    USERNAME.0,
    PASSWORD.0,
    PASSWORD_FILE,
    SSL_FILES[0].0,
    SSL_FILES[1].0,
    SSL_FILES[2].0,
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecurityError {
    #[error("{variable}: {problem}")]
    Invalid {
        variable: &'static str,
        problem: String,
    },
    #[error("ASYNCD_KAFKA_SASL_PASSWORD_FILE: cannot read {0}: {1}")]
    PasswordFile(PathBuf, String),
}

fn invalid(variable: &'static str, problem: impl Into<String>) -> SecurityError {
    SecurityError::Invalid {
        variable,
        problem: problem.into(),
    }
}

/// librdkafka properties for TLS and SASL; empty means plaintext without authentication.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSecurity {
    properties: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        for (key, value) in &self.properties {
            if *key == PASSWORD.1 {
                map.entry(key, &"***");
            } else {
                map.entry(key, value);
            }
        }
        map.finish()
    }
}

impl KafkaSecurity {
    /// From this process's environment.
    pub fn from_env() -> Result<Self, SecurityError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From the variables `get` returns (empty values count as unset). Refuses
    /// combinations librdkafka would only reject at connect time, or silently ignore:
    /// SASL settings without a `sasl_*` protocol, a SASL protocol without a mechanism,
    /// user or password, TLS files without an `ssl` protocol.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SecurityError> {
        let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let protocol = match get(PROTOCOL.0) {
            None => "plaintext".to_string(),
            Some(p) => {
                let p = p.trim().to_ascii_lowercase();
                if !matches!(
                    p.as_str(),
                    "plaintext" | "ssl" | "sasl_plaintext" | "sasl_ssl"
                ) {
                    return Err(invalid(
                        PROTOCOL.0,
                        format!("{p:?} is not one of plaintext, ssl, sasl_plaintext, sasl_ssl"),
                    ));
                }
                p
            }
        };
        let sasl = protocol.starts_with("sasl_");
        let tls = protocol.ends_with("ssl");
        let mut properties = Vec::new();
        if protocol != "plaintext" {
            properties.push((PROTOCOL.1, protocol.clone()));
        }

        let password = match (get(PASSWORD.0), get(PASSWORD_FILE)) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    PASSWORD.0,
                    format!("set either it or {PASSWORD_FILE}, not both"),
                ));
            }
            (Some(password), None) => Some(password),
            (None, Some(path)) => {
                let path = PathBuf::from(path);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| SecurityError::PasswordFile(path.clone(), e.to_string()))?;
                // A file written with `echo` ends in a newline that is no part of it.
                Some(text.trim_end_matches(['\r', '\n']).to_string())
            }
            (None, None) => None,
        };
        let mechanism = get(MECHANISM.0).map(|m| m.trim().to_ascii_uppercase());
        let username = get(USERNAME.0);
        if sasl {
            let mechanism = mechanism.ok_or_else(|| {
                invalid(
                    MECHANISM.0,
                    format!("required with {}={protocol}", PROTOCOL.0),
                )
            })?;
            if !matches!(
                mechanism.as_str(),
                "SCRAM-SHA-256" | "SCRAM-SHA-512" | "PLAIN"
            ) {
                return Err(invalid(
                    MECHANISM.0,
                    format!("{mechanism:?} is not one of SCRAM-SHA-256, SCRAM-SHA-512, PLAIN"),
                ));
            }
            let username = username.ok_or_else(|| {
                invalid(
                    USERNAME.0,
                    format!("required with {}={mechanism}", MECHANISM.0),
                )
            })?;
            let password = password.ok_or_else(|| {
                invalid(
                    PASSWORD.0,
                    format!(
                        "required (or {PASSWORD_FILE}) with {}={mechanism}",
                        MECHANISM.0
                    ),
                )
            })?;
            properties.push((MECHANISM.1, mechanism));
            properties.push((USERNAME.1, username));
            properties.push((PASSWORD.1, password));
        } else {
            for (variable, set) in [
                (MECHANISM.0, mechanism.is_some()),
                (USERNAME.0, username.is_some()),
                (PASSWORD.0, password.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        variable,
                        format!(
                            "needs {}=sasl_ssl or sasl_plaintext, not {protocol}",
                            PROTOCOL.0
                        ),
                    ));
                }
            }
        }
        for (variable, property) in SSL_FILES {
            if let Some(path) = get(variable) {
                if !tls {
                    return Err(invalid(
                        variable,
                        format!("needs {}=ssl or sasl_ssl, not {protocol}", PROTOCOL.0),
                    ));
                }
                properties.push((property, path));
            }
        }
        Ok(Self { properties })
    }

    /// Sets the properties on a client's configuration.
    pub fn apply<'a>(&self, config: &'a mut ClientConfig) -> &'a mut ClientConfig {
        for (key, value) in &self.properties {
            config.set(*key, value);
        }
        config
    }

    /// A configuration with `bootstrap.servers` and these properties.
    pub fn client_config(&self, brokers: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        self.apply(&mut config);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<KafkaSecurity, SecurityError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        KafkaSecurity::from_lookup(|name| vars.get(name).cloned())
    }

    fn props(security: &KafkaSecurity) -> Vec<(&str, &str)> {
        security
            .properties
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect()
    }

    #[test]
    fn nothing_set_is_plaintext_without_properties() {
        assert_eq!(from(&[]).unwrap(), KafkaSecurity::default());
        assert_eq!(
            from(&[("ASYNCD_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")]).unwrap(),
            KafkaSecurity::default()
        );
    }

    #[test]
    fn scram_over_tls_maps_onto_librdkafka_properties() {
        let security = from(&[
            ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("ASYNCD_KAFKA_SASL_MECHANISM", "scram-sha-512"),
            ("ASYNCD_KAFKA_SASL_USERNAME", "asyncd"),
            ("ASYNCD_KAFKA_SASL_PASSWORD", "Kafka-Pw-1"),
            ("ASYNCD_KAFKA_SSL_CA_LOCATION", "/etc/kafka/ca.crt"),
        ])
        .unwrap();
        assert_eq!(
            props(&security),
            [
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "asyncd"),
                ("sasl.password", "Kafka-Pw-1"),
                ("ssl.ca.location", "/etc/kafka/ca.crt"),
            ]
        );
        let config = security.client_config("broker:9093");
        assert_eq!(config.get("bootstrap.servers"), Some("broker:9093"));
        assert_eq!(config.get("sasl.password"), Some("Kafka-Pw-1"));
        assert_eq!(config.get("security.protocol"), Some("sasl_ssl"));
        // the password stays out of Debug output (and so out of logs of it)
        let shown = format!("{security:?}");
        assert!(
            !shown.contains("Kafka-Pw-1") && shown.contains("sasl.username"),
            "{shown}"
        );
    }

    #[test]
    fn the_password_may_come_from_a_file() {
        let dir = std::env::temp_dir().join(format!("asyncd-kafka-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "from-a-file\n").unwrap();
        let security = from(&[
            ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
            ("ASYNCD_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256"),
            ("ASYNCD_KAFKA_SASL_USERNAME", "asyncd"),
            ("ASYNCD_KAFKA_SASL_PASSWORD_FILE", file.to_str().unwrap()),
        ])
        .unwrap();
        assert!(props(&security).contains(&("sasl.password", "from-a-file")));
        let missing = dir.join("missing");
        let err = from(&[
            ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
            ("ASYNCD_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256"),
            ("ASYNCD_KAFKA_SASL_USERNAME", "asyncd"),
            ("ASYNCD_KAFKA_SASL_PASSWORD_FILE", missing.to_str().unwrap()),
        ])
        .unwrap_err();
        assert!(
            matches!(err, SecurityError::PasswordFile(ref p, _) if *p == missing),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn inconsistent_settings_are_refused_naming_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("ASYNCD_KAFKA_SECURITY_PROTOCOL", "tls")],
                "ASYNCD_KAFKA_SECURITY_PROTOCOL",
            ),
            (
                &[("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl")],
                "ASYNCD_KAFKA_SASL_MECHANISM",
            ),
            (
                &[
                    ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl"),
                    ("ASYNCD_KAFKA_SASL_MECHANISM", "GSSAPI"),
                ],
                "ASYNCD_KAFKA_SASL_MECHANISM",
            ),
            (
                &[
                    ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl"),
                    ("ASYNCD_KAFKA_SASL_MECHANISM", "PLAIN"),
                    ("ASYNCD_KAFKA_SASL_USERNAME", "u"),
                ],
                "ASYNCD_KAFKA_SASL_PASSWORD",
            ),
            (
                &[
                    ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl"),
                    ("ASYNCD_KAFKA_SASL_MECHANISM", "PLAIN"),
                    ("ASYNCD_KAFKA_SASL_PASSWORD", "p"),
                ],
                "ASYNCD_KAFKA_SASL_USERNAME",
            ),
            (
                &[("ASYNCD_KAFKA_SASL_USERNAME", "u")],
                "ASYNCD_KAFKA_SASL_USERNAME",
            ),
            (
                &[
                    ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
                    ("ASYNCD_KAFKA_SASL_MECHANISM", "PLAIN"),
                    ("ASYNCD_KAFKA_SASL_USERNAME", "u"),
                    ("ASYNCD_KAFKA_SASL_PASSWORD", "p"),
                    ("ASYNCD_KAFKA_SSL_CA_LOCATION", "/ca"),
                ],
                "ASYNCD_KAFKA_SSL_CA_LOCATION",
            ),
            (
                &[
                    ("ASYNCD_KAFKA_SASL_PASSWORD", "p"),
                    ("ASYNCD_KAFKA_SASL_PASSWORD_FILE", "/f"),
                ],
                "ASYNCD_KAFKA_SASL_PASSWORD",
            ),
        ];
        for (vars, variable) in cases {
            let err = from(vars).unwrap_err();
            assert!(
                matches!(&err, SecurityError::Invalid { variable: v, .. } if v == variable),
                "{vars:?}: {err}"
            );
        }
    }

    #[test]
    fn librdkafka_accepts_the_properties() {
        // The build has TLS and SCRAM: librdkafka refuses these at creation otherwise
        // ("OpenSSL not available at build time").
        let security = from(&[
            ("ASYNCD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl"),
            ("ASYNCD_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256"),
            ("ASYNCD_KAFKA_SASL_USERNAME", "asyncd"),
            ("ASYNCD_KAFKA_SASL_PASSWORD", "x"),
        ])
        .unwrap();
        let created: Result<rdkafka::producer::BaseProducer, _> =
            security.client_config("127.0.0.1:9").create();
        assert!(created.is_ok(), "{:?}", created.err());
    }
}
