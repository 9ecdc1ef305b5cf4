//! Value parsers of the flags: every value is checked when the command line is parsed, with a
//! message that says what is wrong and what is accepted (clap prints it and exits 2), so no
//! command starts, creates a folder or reaches C code with a value it cannot honour.

/// A count that must be at least 1 (`-p`, `-r`, `-k`, `--parallel`, ...).
pub fn at_least_one(s: &str) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number"))?;
    if v == 0 {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

/// The CPUs this process may run on.
pub fn cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
}

/// Checks a thread count against this machine: at least 1, at most the CPUs this process may
/// use (more threads than CPUs time the scheduler's time slicing, not the engine; the count is
/// refused rather than silently clamped). The CPU count is far below `i32::MAX`, so a count
/// that passes never turns negative where ggml takes an `int`.
pub fn check_threads(v: u32, cpus: u32) -> Result<u32, String> {
    if v == 0 {
        return Err("must be at least 1".into());
    }
    if v > cpus {
        return Err(format!(
            "{v} threads, but this machine has {cpus} CPUs available: more threads than CPUs \
             would time the scheduler, not the engine"
        ));
    }
    Ok(v)
}

/// `-t`: a thread count this machine can run ([`check_threads`]).
pub fn threads(s: &str) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number of threads"))?;
    check_threads(v, cpus())
}

fn finite(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() {
        return Err(format!("'{s}' is not a finite number"));
    }
    Ok(v)
}

/// `--noise-gate`: a share between 0 and 1 (of one CPU, and of the machine).
pub fn share(s: &str) -> Result<f64, String> {
    let v = finite(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is not a share between 0 and 1"));
    }
    Ok(v)
}

/// `--canary`: a slowdown above 0 (0.25 = 25 % slower than the canary's best).
pub fn slowdown(s: &str) -> Result<f64, String> {
    let v = finite(s)?;
    if v <= 0.0 {
        return Err(format!(
            "{v} is not a slowdown above 0 (0.25: 25 % slower than the canary's best)"
        ));
    }
    Ok(v)
}

/// `--min-effect`: a relative change, at least 0 and below 1.
pub fn effect(s: &str) -> Result<f64, String> {
    let v = finite(s)?;
    if !(0.0..1.0).contains(&v) {
        return Err(format!(
            "{v} is not a relative change from 0 (any change) to below 1 (100 %)"
        ));
    }
    Ok(v)
}

/// `--max-nmse`: a positive error.
pub fn positive(s: &str) -> Result<f64, String> {
    let v = finite(s)?;
    if v <= 0.0 {
        return Err(format!("{v} must be above 0"));
    }
    Ok(v)
}

/// `--near-tie`: a margin of at least 0.
pub fn non_negative(s: &str) -> Result<f64, String> {
    let v = finite(s)?;
    if v < 0.0 {
        return Err(format!("{v} must be at least 0"));
    }
    Ok(v)
}

/// `compare --fail-above`: a percentage, at least 0 (0: any slowdown beyond the noise fails).
pub fn percent(s: &str) -> Result<f64, String> {
    let v = finite(s.trim_end_matches('%'))?;
    if v < 0.0 {
        return Err(format!("{v} is not a percentage of at least 0"));
    }
    Ok(v / 100.0)
}

/// `--rpc`: HOST:PORT as ggml's RPC client parses it (one colon, a port in 1..=65535).
pub fn endpoint(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}' is not HOST:PORT"))?;
    if host.is_empty() || host.contains(':') {
        return Err(format!(
            "'{s}' is not HOST:PORT (an IPv4 address or a name; ggml's RPC client takes no IPv6)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(format!("'{port}' is not a port in 1..=65535")),
    }
}

/// `--rpc-timeout`: seconds, more than 0 and at most a day.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v = finite(s)?;
    if v <= 0.0 || v > 86_400.0 {
        return Err(format!("{v} is not a number of seconds in (0, 86400]"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_beyond_the_cpus_or_zero_are_refused() {
        assert_eq!(check_threads(2, 16), Ok(2));
        assert_eq!(check_threads(16, 16), Ok(16));
        assert!(check_threads(0, 16).unwrap_err().contains("at least 1"));
        let e = check_threads(17, 16).unwrap_err();
        assert!(e.contains("17 threads") && e.contains("16 CPUs"), "{e}");
        // above i32: refused, never cast negative into ggml
        assert!(threads("3000000000").is_err());
        assert!(threads("-1").is_err());
        assert!(threads("0").is_err());
    }

    #[test]
    fn fail_above_takes_a_percentage() {
        assert_eq!(percent("5"), Ok(0.05));
        assert_eq!(percent("2.5%"), Ok(0.025));
        assert_eq!(percent("0"), Ok(0.0));
        assert!(percent("-1").is_err());
        assert!(percent("five").is_err());
    }

    #[test]
    fn shares_effects_and_tolerances_must_be_finite_and_in_range() {
        assert_eq!(share("0.1"), Ok(0.1));
        assert_eq!(share("1"), Ok(1.0));
        for bad in ["NaN", "-0.1", "1.5", "inf", "x"] {
            assert!(share(bad).is_err(), "{bad}");
        }
        assert_eq!(effect("0"), Ok(0.0));
        for bad in ["-0.02", "1", "NaN"] {
            assert!(effect(bad).is_err(), "{bad}");
        }
        assert_eq!(positive("1e-4"), Ok(1e-4));
        for bad in ["0", "-1e-3", "NaN"] {
            assert!(positive(bad).is_err(), "{bad}");
        }
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(at_least_one("0").is_err() && at_least_one("-2").is_err());
    }
}
