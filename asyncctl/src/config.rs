//! Where asyncctl finds the API and its credentials: a flag, else an environment
//! variable, else the config file, else the defaults (`asyncd dev` on loopback; inside a
//! cluster, the pod's projected token for the audience `asyncd`).

use std::path::{Path, PathBuf};

use asyncd_client::{Client, DEFAULT_ENDPOINT, DEFAULT_TOKEN_FILE};
use serde::Deserialize;

use crate::exit::{Failure, usage};

/// The config file when `--config` (`ASYNCCTL_CONFIG`) names none:
/// `$XDG_CONFIG_HOME/asyncctl/config.yaml`, else `$HOME/.config/asyncctl/config.yaml`.
pub fn default_path() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("asyncctl").join("config.yaml"))
}

/// The config file: every key optional.
///
/// ```yaml
/// server: https://asyncd.example.com
/// token: s3cr3t             # or:
/// token_file: /path/to/token
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub server: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
}

impl File {
    /// The file at `path`; a missing file is an empty one (nothing configured), a file
    /// that does not parse is a usage error naming it.
    pub fn read(path: &Path) -> Result<Self, Failure> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(err) => return Err(usage(format!("config file {}: {err}", path.display()))),
        };
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_yaml::from_str(&text)
            .map_err(|err| usage(format!("config file {}: {err}", path.display())))
    }
}

/// Where the token comes from, in order of precedence.
#[derive(Debug, PartialEq)]
pub enum Token {
    Given(String),
    File(PathBuf),
}

/// The server and credentials from the flags (which clap fills from `ASYNCD_SERVER`
/// and `ASYNCD_TOKEN` too) and the config file.
#[derive(Debug, PartialEq)]
pub struct Resolved {
    pub server: String,
    pub token: Token,
}

pub fn resolve(server: Option<String>, token: Option<String>, file: File) -> Resolved {
    let server = server
        .or(file.server)
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
    let token = match (token, file.token, file.token_file) {
        (Some(token), _, _) | (None, Some(token), _) => Token::Given(token),
        (None, None, Some(path)) => Token::File(path),
        // Inside a pod: the projected ServiceAccount token for the audience `asyncd`
        // (docs/security.md); elsewhere the file is absent and no token is sent.
        (None, None, None) => Token::File(PathBuf::from(DEFAULT_TOKEN_FILE)),
    };
    Resolved { server, token }
}

impl Resolved {
    pub fn client(&self, timeout: std::time::Duration) -> Result<Client, Failure> {
        let builder = Client::builder()
            .endpoint(&self.server)
            .service_name("asyncctl")
            .timeout(timeout);
        let builder = match &self.token {
            Token::Given(token) => builder.token(token.trim()),
            Token::File(path) => builder.token_file(path),
        };
        builder
            .build()
            .map_err(|err| usage(format!("--server {:?}: {err}", self.server)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> File {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_flag_beats_the_file_which_beats_the_defaults() {
        let both = "server: http://file:1\ntoken: from-file\n";
        assert_eq!(
            resolve(
                Some("http://flag:1".into()),
                Some("flag".into()),
                file(both)
            ),
            Resolved {
                server: "http://flag:1".into(),
                token: Token::Given("flag".into())
            }
        );
        assert_eq!(
            resolve(None, None, file(both)),
            Resolved {
                server: "http://file:1".into(),
                token: Token::Given("from-file".into())
            }
        );
        assert_eq!(
            resolve(None, None, file("token_file: /t\n")).token,
            Token::File("/t".into())
        );
        assert_eq!(
            resolve(None, None, File::default()),
            Resolved {
                server: DEFAULT_ENDPOINT.into(),
                token: Token::File(DEFAULT_TOKEN_FILE.into())
            }
        );
    }

    #[test]
    fn a_bad_config_file_names_itself_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        assert_eq!(File::read(&path).unwrap().server, None);
        std::fs::write(&path, "sever: http://typo\n").unwrap();
        let err = File::read(&path).unwrap_err();
        assert_eq!(err.code, crate::exit::USAGE);
        assert!(
            err.message.contains("config.yaml") && err.message.contains("sever"),
            "{}",
            err.message
        );
    }
}
