//! What each task of the run is: its executor behaviour, its delay and whether it goes
//! in a batch, each a fixed function of the seed and the task's index.

/// SplitMix64: a fixed, portable mixing function, so a seed means the same run everywhere.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub(super) fn draw(seed: u64, stream: u64, index: u64) -> u64 {
    mix(mix(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03)) ^ index)
}

/// What the soak's executor does with a task, carried in its payload (`"b"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 at once.
    Ok,
    /// 500 on the first n attempts, then 200.
    FailThenOk(u32),
    /// 200 after half the executor timeout.
    Slow,
    /// 200 with a body that is not JSON.
    InvalidJson200,
    /// 202 with a body that is not JSON (so the default lease), then heartbeat and result.
    InvalidJson202,
    /// 200 with NUL bytes in the body.
    NulBody,
    /// 200 with a 2 MiB body.
    HugeBody,
    /// 307 to the executor's own URL on every attempt. asyncd must not follow it (the
    /// target answers 200, which would end the task succeeded): it ends dead.
    Redirect,
    /// 202 with a lease, then heartbeat and a success result through the callback API.
    Callback,
    /// 422 on every attempt: must end in dead letters.
    Permanent,
    /// First attempt: the connection is accepted and never answered (the call runs into
    /// the attempt's timeout); then 200.
    Hang,
    /// First attempt: 200 and its headers at once, then the body one byte a second, far
    /// slower than the timeout allows; then 200.
    Trickle,
    /// First attempt: 200 and its headers with a `content-length` the body never reaches,
    /// then the connection is closed; then 200.
    CutAfterHeaders,
}

/// A task's end state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndState {
    Succeeded,
    Dead,
}

impl EndState {
    /// As the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Dead => "dead",
        }
    }
}

impl Behaviour {
    /// The behaviour of task `index` in the run of `seed`: 80 % plain successes, the rest
    /// spread over the misbehaviours.
    pub fn of(seed: u64, index: u64) -> Self {
        let r = draw(seed, 1, index) % 1000;
        match r {
            0..785 => Self::Ok,
            785..790 => Self::Hang,
            790..795 => Self::Trickle,
            795..800 => Self::CutAfterHeaders,
            800..860 => Self::FailThenOk(1 + (r % 3) as u32),
            860..875 => Self::Slow,
            875..890 => Self::InvalidJson200,
            890..905 => Self::InvalidJson202,
            905..920 => Self::NulBody,
            920..925 => Self::HugeBody,
            925..940 => Self::Redirect,
            940..980 => Self::Callback,
            _ => Self::Permanent,
        }
    }

    pub fn code(self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::FailThenOk(n) => format!("fail{n}"),
            Self::Slow => "slow".into(),
            Self::InvalidJson200 => "json200".into(),
            Self::InvalidJson202 => "json202".into(),
            Self::NulBody => "nul".into(),
            Self::HugeBody => "huge".into(),
            Self::Redirect => "redirect".into(),
            Self::Callback => "callback".into(),
            Self::Permanent => "permanent".into(),
            Self::Hang => "hang".into(),
            Self::Trickle => "trickle".into(),
            Self::CutAfterHeaders => "cut".into(),
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "ok" => Self::Ok,
            "slow" => Self::Slow,
            "json200" => Self::InvalidJson200,
            "json202" => Self::InvalidJson202,
            "nul" => Self::NulBody,
            "huge" => Self::HugeBody,
            "redirect" => Self::Redirect,
            "callback" => Self::Callback,
            "permanent" => Self::Permanent,
            "hang" => Self::Hang,
            "trickle" => Self::Trickle,
            "cut" => Self::CutAfterHeaders,
            _ => Self::FailThenOk(code.strip_prefix("fail")?.parse().ok()?),
        })
    }

    pub fn expected(self) -> EndState {
        match self {
            // Redirects are never followed: every attempt fails, so the task dies.
            Self::Permanent | Self::Redirect => EndState::Dead,
            _ => EndState::Succeeded,
        }
    }
}

/// Submit delay of task `index`: one in ten due at once, the rest spread over 0..=max.
pub fn delay_ms(seed: u64, index: u64, max_ms: u64) -> u64 {
    let r = draw(seed, 2, index);
    if r.is_multiple_of(10) {
        0
    } else {
        (r >> 8) % (max_ms + 1)
    }
}

/// Submit units: `(first index, count, batch?)`, singles and batches of 10–100 mixed.
pub fn units(seed: u64, n: usize) -> Vec<(usize, usize, bool)> {
    let mut units = Vec::new();
    let mut i = 0;
    while i < n {
        let r = draw(seed, 3, i as u64);
        if r.is_multiple_of(2) {
            let count = (10 + (r >> 8) as usize % 91).min(n - i);
            units.push((i, count, true));
            i += count;
        } else {
            units.push((i, 1, false));
            i += 1;
        }
    }
    units
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn behaviour_is_a_function_of_the_seed_and_index_and_survives_the_payload() {
        for index in 0..10_000 {
            let b = Behaviour::of(7, index);
            assert_eq!(b, Behaviour::of(7, index));
            assert_eq!(Behaviour::parse(&b.code()), Some(b), "{b:?}");
        }
        assert_eq!(Behaviour::parse("fail"), None);
        assert_eq!(Behaviour::parse("bogus"), None);
        // Other seeds give other runs.
        let differing = (0..1000)
            .filter(|i| Behaviour::of(7, *i) != Behaviour::of(8, *i))
            .count();
        assert!(differing > 100, "{differing}");
    }

    #[test]
    fn every_behaviour_occurs_in_about_its_share() {
        let n = 100_000;
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for index in 0..n {
            let code = match Behaviour::of(42, index) {
                Behaviour::FailThenOk(k) => {
                    assert!((1..=3).contains(&k));
                    "fail".to_string()
                }
                b => b.code(),
            };
            *counts.entry(code).or_default() += 1;
        }
        let share = |code: &str| counts.get(code).copied().unwrap_or(0) as f64 / n as f64;
        assert!((share("ok") - 0.785).abs() < 0.01, "{counts:?}");
        assert!((share("fail") - 0.06).abs() < 0.005, "{counts:?}");
        assert!((share("permanent") - 0.02).abs() < 0.003, "{counts:?}");
        for socket in ["hang", "trickle", "cut"] {
            assert!((share(socket) - 0.005).abs() < 0.002, "{counts:?}");
        }
        assert_eq!(counts.len(), 13, "{counts:?}");
    }

    #[test]
    fn only_permanent_failures_and_redirects_end_dead() {
        assert_eq!(Behaviour::Permanent.expected(), EndState::Dead);
        assert_eq!(Behaviour::Redirect.expected(), EndState::Dead);
        for b in [
            Behaviour::Ok,
            Behaviour::FailThenOk(3),
            Behaviour::Slow,
            Behaviour::InvalidJson200,
            Behaviour::InvalidJson202,
            Behaviour::NulBody,
            Behaviour::HugeBody,
            Behaviour::Callback,
            Behaviour::Hang,
            Behaviour::Trickle,
            Behaviour::CutAfterHeaders,
        ] {
            assert_eq!(b.expected(), EndState::Succeeded, "{b:?}");
        }
    }

    #[test]
    fn delays_cover_both_routes_within_the_maximum() {
        let delays: Vec<u64> = (0..10_000).map(|i| delay_ms(3, i, 60_000)).collect();
        assert!(delays.iter().all(|d| *d <= 60_000));
        let now = delays.iter().filter(|d| **d == 0).count();
        assert!((800..1200).contains(&now), "{now}");
        let store_route = delays.iter().filter(|d| **d > 20_000).count();
        assert!((5500..6500).contains(&store_route), "{store_route}");
    }

    #[test]
    fn units_cover_every_index_once_with_singles_and_batches() {
        let units = units(5, 10_007);
        let mut next = 0;
        for (first, count, batch) in &units {
            assert_eq!(*first, next);
            assert!(*count >= 1 && *count <= 100);
            if !batch {
                assert_eq!(*count, 1);
            }
            next += count;
        }
        assert_eq!(next, 10_007);
        assert!(units.iter().any(|u| u.2) && units.iter().any(|u| !u.2));
    }
}
