//! DOS dates and times (FAT directory entries) to and from the Unix clock, in UTC.
//!
//! FAT stores local time without a zone; the server treats it as UTC so that what it writes
//! reads back unchanged whatever the machine's zone. DOS time has 2-second resolution (the
//! creation time 10 ms) and covers 1980-2107: times outside are clamped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fatfs::{Date, DateTime, Time, TimeProvider};

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The DOS date-time of a Unix time (clamped to 1980-01-01 .. 2107-12-31 23:59:59).
pub(crate) fn to_dos(t: SystemTime) -> DateTime {
    let first = days_from_civil(1980, 1, 1) * 86_400;
    let last = days_from_civil(2107, 12, 31) * 86_400 + 86_399;
    let (secs, millis) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (i64::try_from(d.as_secs()).unwrap_or(last), d.subsec_millis()),
        Err(_) => (first, 0),
    };
    let secs = secs.clamp(first, last);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    // Every value is in range by the clamp: the conversions cannot fail.
    let small = |v: i64| u16::try_from(v).unwrap_or(0);
    DateTime {
        date: Date { year: small(year), month: small(month), day: small(day) },
        time: Time {
            hour: small(of_day / 3600),
            min: small(of_day / 60 % 60),
            sec: small(of_day % 60),
            millis: u16::try_from(millis).unwrap_or(0),
        },
    }
}

/// The Unix time of a DOS date-time (an invalid stored date reads as 1980-01-01).
pub(crate) fn from_dos(dt: DateTime) -> SystemTime {
    let year = i64::from(dt.date.year);
    let (month, day) = (i64::from(dt.date.month), i64::from(dt.date.day));
    let (month, day) =
        if (1..=12).contains(&month) && (1..=31).contains(&day) { (month, day) } else { (1, 1) };
    let secs = days_from_civil(year, month, day) * 86_400
        + i64::from(dt.time.hour.min(23)) * 3600
        + i64::from(dt.time.min.min(59)) * 60
        + i64::from(dt.time.sec.min(59));
    UNIX_EPOCH
        + Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        + Duration::from_millis(u64::from(dt.time.millis.min(999)))
}

/// fatfs' clock: the system clock in UTC.
#[derive(Debug)]
pub(crate) struct UtcClock;

pub(crate) static UTC_CLOCK: UtcClock = UtcClock;

impl TimeProvider for UtcClock {
    fn get_current_date(&self) -> Date {
        to_dos(SystemTime::now()).date
    }
    fn get_current_date_time(&self) -> DateTime {
        to_dos(SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates_convert_both_ways() {
        // 2026-11-25 09:30:42 UTC = 1795599042.
        let t = UNIX_EPOCH + Duration::from_secs(1_795_599_042);
        let dt = to_dos(t);
        assert_eq!((dt.date.year, dt.date.month, dt.date.day), (2026, 11, 25));
        assert_eq!((dt.time.hour, dt.time.min, dt.time.sec), (9, 30, 42));
        assert_eq!(from_dos(dt), t);
        // A leap day.
        let leap = to_dos(
            UNIX_EPOCH
                + Duration::from_secs(
                    u64::try_from(days_from_civil(2024, 2, 29)).unwrap() * 86_400,
                ),
        );
        assert_eq!((leap.date.year, leap.date.month, leap.date.day), (2024, 2, 29));
    }

    #[test]
    fn times_outside_the_dos_range_are_clamped() {
        let dt = to_dos(UNIX_EPOCH);
        assert_eq!((dt.date.year, dt.date.month, dt.date.day), (1980, 1, 1));
        let dt = to_dos(UNIX_EPOCH + Duration::from_secs(10_000_000_000));
        assert_eq!(dt.date.year, 2107);
    }
}
