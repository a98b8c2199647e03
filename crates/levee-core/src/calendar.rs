//! Calendar periods in UTC, used by the `quota` algorithm.
//!
//! Quotas reset at calendar boundaries (midnight UTC, or the first day of a
//! month at midnight UTC), so their windows have real, varying lengths:
//! months have 28 to 31 days and February follows the Gregorian leap-year
//! rules. Everything here is pure integer arithmetic on [`Millis`] since the
//! Unix epoch, using the proleptic Gregorian calendar and ignoring leap
//! seconds (as Unix time does).
//!
//! A period is identified by its *index*: the number of whole periods between
//! the epoch and the start of the period. For [`CalendarPeriod::Day`] that is
//! the number of days since 1970-01-01; for [`CalendarPeriod::Month`] it is the
//! number of months since January 1970.

use crate::time::Millis;

const MS_PER_DAY: u64 = 86_400_000;

/// Days from 0000-03-01 (the start of a 400-year era in the shifted
/// calendar used below) to 1970-01-01.
const EPOCH_SHIFT_DAYS: i64 = 719_468;

/// Days in one 400-year Gregorian cycle.
const DAYS_PER_ERA: i64 = 146_097;

/// Month indexes past this many years after 1970 start beyond the range of
/// [`Millis`] (which covers roughly 584.5 million years), so they saturate.
const MAX_MONTH_YEARS: u64 = 600_000_000;

/// A calendar period in UTC.
///
/// Serialized in lowercase: `"day"` or `"month"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalendarPeriod {
    /// A UTC calendar day, from midnight to the next midnight.
    Day,
    /// A UTC calendar month, from midnight on its first day to midnight on
    /// the first day of the next month.
    Month,
}

impl CalendarPeriod {
    /// Returns the index of the period containing `now`.
    ///
    /// For [`Day`](Self::Day) this is the number of days since 1970-01-01;
    /// for [`Month`](Self::Month) it is the number of months since January
    /// 1970 (`year * 12 + month0 - 1970 * 12`, with `month0` counted from 0).
    /// The index changes exactly at the period boundary:
    /// `start(index(now)) <= now < end(index(now))`.
    pub fn index(self, now: Millis) -> u64 {
        let days = now / MS_PER_DAY;
        match self {
            Self::Day => days,
            Self::Month => {
                // `days` is at most u64::MAX / MS_PER_DAY, far below i64::MAX.
                let (year, month, _) = civil_from_days(days as i64);
                // `now` is not before the epoch, so `year >= 1970`.
                (year - 1970) as u64 * 12 + u64::from(month - 1)
            }
        }
    }

    /// Returns the first millisecond of the period with the given index.
    ///
    /// Saturates at `Millis::MAX` for indexes whose start lies beyond the
    /// range of [`Millis`].
    pub fn start(self, index: u64) -> Millis {
        match self {
            Self::Day => index.saturating_mul(MS_PER_DAY),
            Self::Month => {
                let years = index / 12;
                if years > MAX_MONTH_YEARS {
                    return Millis::MAX;
                }
                let month = (index % 12) as u32 + 1;
                let days = days_from_civil(1970 + years as i64, month, 1);
                // `days` is non-negative because the date is not before 1970.
                (days as u64).saturating_mul(MS_PER_DAY)
            }
        }
    }

    /// Returns the exclusive end of the period with the given index, which is
    /// the start of the next period.
    ///
    /// Saturates at `Millis::MAX` like [`start`](Self::start).
    pub fn end(self, index: u64) -> Millis {
        self.start(index.saturating_add(1))
    }

    /// Returns the number of milliseconds from `now` until the end of the
    /// period containing `now`.
    ///
    /// The result is always at least 1: at the last millisecond of a period
    /// it is 1, and at the first millisecond it is the whole period length.
    pub fn until_end(self, now: Millis) -> Millis {
        // Only at the very end of the representable range can `end`
        // saturate to `now` itself; clamp so the contract still holds.
        self.end(self.index(now)).saturating_sub(now).max(1)
    }

    /// Returns the length in milliseconds of the period with the given index
    /// (`end(index) - start(index)`).
    ///
    /// A day is always 86 400 000 ms; a month is 28, 29, 30 or 31 days.
    pub fn length(self, index: u64) -> Millis {
        self.end(index).saturating_sub(self.start(index))
    }
}

/// Returns whether `year` is a leap year in the proleptic Gregorian calendar.
///
/// Years divisible by 4 are leap years, except those divisible by 100 that
/// are not divisible by 400 (so 2000 and 2024 are leap years, 1900, 2023 and
/// 2100 are not). Year 0 (1 BC) is a leap year.
pub fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Returns the number of days in `month` (1 = January, ..., 12 = December)
/// of `year`.
///
/// # Panics
///
/// Panics if `month` is not in `1..=12`.
pub fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => panic!("month must be in 1..=12, got {month}"),
    }
}

/// Returns the number of days from 1970-01-01 to the given proleptic
/// Gregorian date (negative for earlier dates).
///
/// `month` must be in `1..=12` (checked by a debug assertion). `day` is used
/// as an offset from the first of the month, so it should normally be in
/// `1..=days_in_month(year, month)`; values outside that range roll over
/// (e.g. `(2024, 3, 0)` is the day before 2024-03-01, which is 2024-02-29).
/// Years are astronomical: year 0 is 1 BC. The arithmetic does not overflow
/// for years with an absolute value up to 10^15.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    debug_assert!(
        (1..=12).contains(&month),
        "month must be in 1..=12, got {month}"
    );
    // Shift the year to start on 1 March so the leap day is the last day of
    // the (shifted) year; January and February belong to the previous one.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400; // 0..=399
    // Month counted from March = 0 to February = 11.
    let shifted_month = (i64::from(month) + 9) % 12;
    // Days before the shifted month: the month lengths from March onwards
    // (31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 31, 28/29) follow this line.
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * DAYS_PER_ERA + day_of_era - EPOCH_SHIFT_DAYS
}

/// Returns the proleptic Gregorian date `(year, month, day)` that is `days`
/// days after 1970-01-01 (before it if negative), with `month` in `1..=12`
/// and `day` in `1..=31`.
///
/// This is the inverse of [`days_from_civil`]. Years are astronomical: year
/// 0 is 1 BC. The arithmetic does not overflow for `days` with an absolute
/// value up to 10^17.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + EPOCH_SHIFT_DAYS;
    let era = z.div_euclid(DAYS_PER_ERA);
    let day_of_era = z - era * DAYS_PER_ERA; // 0..=146_096
    // Remove the leap days accumulated so far (one per 4 years, minus one
    // per 100 years, plus one for the last day of the era) to find the year.
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Invert the month-start line used by `days_from_civil`.
    let shifted_month = (5 * day_of_year + 2) / 153; // 0 = March ..= 11 = February
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // `month` is in 1..=12 and `day` in 1..=31, so the casts are lossless.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds at midnight UTC starting the given date.
    fn midnight(year: i64, month: u32, day: u32) -> Millis {
        let days = days_from_civil(year, month, day);
        assert!(days >= 0, "date before the epoch");
        days as u64 * MS_PER_DAY
    }

    /// Asserts that the period index increments by exactly one at the given
    /// midnight, and not a millisecond earlier.
    fn assert_boundary(period: CalendarPeriod, boundary: Millis) {
        let last = boundary - 1;
        let before = period.index(last);
        let after = period.index(boundary);
        assert_eq!(after, before + 1, "{period:?} at {boundary}");
        assert_eq!(period.end(before), boundary);
        assert_eq!(period.start(after), boundary);
        assert_eq!(period.until_end(last), 1);
        assert_eq!(period.until_end(boundary), period.length(after));
    }

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        // 2000-01-01T00:00:00Z is Unix time 946684800.
        assert_eq!(days_from_civil(2000, 1, 1), 946_684_800 / 86_400);
        // 2024-01-01T00:00:00Z is Unix time 1704067200.
        assert_eq!(days_from_civil(2024, 1, 1), 1_704_067_200 / 86_400);
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(days_from_civil(0, 3, 1), -EPOCH_SHIFT_DAYS);
        assert_eq!(days_from_civil(2024, 3, 0), days_from_civil(2024, 2, 29));
    }

    #[test]
    fn epoch_is_index_zero() {
        assert_eq!(CalendarPeriod::Day.index(0), 0);
        assert_eq!(CalendarPeriod::Month.index(0), 0);
        assert_eq!(CalendarPeriod::Day.start(0), 0);
        assert_eq!(CalendarPeriod::Month.start(0), 0);
        assert_eq!(CalendarPeriod::Month.end(0), 31 * MS_PER_DAY);
        assert_eq!(
            CalendarPeriod::Month.index(midnight(2024, 2, 15)),
            54 * 12 + 1
        );
    }

    #[test]
    fn january_to_february() {
        let boundary = midnight(2024, 2, 1);
        assert_boundary(CalendarPeriod::Day, boundary);
        assert_boundary(CalendarPeriod::Month, boundary);
        // 2024-01-31T23:59:59.999Z
        let last = boundary - 1;
        assert_eq!(civil_from_days((last / MS_PER_DAY) as i64), (2024, 1, 31));
        assert_eq!(last % MS_PER_DAY, 86_399_999);
        assert_eq!(CalendarPeriod::Month.index(last), 54 * 12);
        assert_eq!(CalendarPeriod::Month.index(boundary), 54 * 12 + 1);
    }

    #[test]
    fn end_of_february() {
        // 2024 is a leap year: 28 Feb -> 29 Feb is a day boundary only.
        let leap_day = midnight(2024, 2, 29);
        assert_eq!(leap_day - midnight(2024, 2, 28), MS_PER_DAY);
        assert_boundary(CalendarPeriod::Day, leap_day);
        assert_eq!(
            CalendarPeriod::Month.index(leap_day - 1),
            CalendarPeriod::Month.index(leap_day)
        );
        assert_boundary(CalendarPeriod::Month, midnight(2024, 3, 1));
        assert_boundary(CalendarPeriod::Day, midnight(2024, 3, 1));

        // 2023 and 2100 are not leap years: 28 Feb -> 1 March.
        // 2000 is a leap year (divisible by 400).
        for (year, leap) in [(2023, false), (2100, false), (2000, true)] {
            assert_eq!(is_leap_year(year), leap, "{year}");
            let feb28 = midnight(year, 2, 28);
            let march1 = midnight(year, 3, 1);
            let expected_days = if leap { 2 } else { 1 };
            assert_eq!(march1 - feb28, expected_days * MS_PER_DAY, "{year}");
            let after_feb28 = civil_from_days((feb28 / MS_PER_DAY) as i64 + 1);
            let expected = if leap { (year, 2, 29) } else { (year, 3, 1) };
            assert_eq!(after_feb28, expected);
            assert_boundary(CalendarPeriod::Day, march1);
            assert_boundary(CalendarPeriod::Month, march1);
            let feb = CalendarPeriod::Month.index(feb28);
            assert_eq!(
                CalendarPeriod::Month.length(feb),
                (28 + u64::from(leap)) * MS_PER_DAY
            );
        }
    }

    #[test]
    fn december_to_january() {
        for year in [1970, 1999, 2023, 2024, 2099, 2199] {
            let boundary = midnight(year + 1, 1, 1);
            assert_eq!(
                civil_from_days((boundary / MS_PER_DAY) as i64 - 1),
                (year, 12, 31)
            );
            assert_boundary(CalendarPeriod::Day, boundary);
            assert_boundary(CalendarPeriod::Month, boundary);
            assert_eq!(
                CalendarPeriod::Month.index(boundary),
                (year + 1 - 1970) as u64 * 12
            );
        }
    }

    #[test]
    fn month_lengths_2023_and_2024() {
        let expected_2023 = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let expected_2024 = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        for (year, expected) in [(2023, expected_2023), (2024, expected_2024)] {
            for month in 1..=12u32 {
                let days = days_in_month(year, month);
                assert_eq!(days, expected[month as usize - 1], "{year}-{month}");
                let index = CalendarPeriod::Month.index(midnight(year, month, 1));
                assert_eq!(index, (year - 1970) as u64 * 12 + u64::from(month - 1));
                assert_eq!(
                    CalendarPeriod::Month.length(index),
                    u64::from(days) * MS_PER_DAY,
                    "{year}-{month}"
                );
                assert_eq!(CalendarPeriod::Month.start(index), midnight(year, month, 1));
            }
        }
    }

    #[test]
    fn day_length_is_constant() {
        for index in [0, 1, 19_782, 1_000_000] {
            assert_eq!(CalendarPeriod::Day.length(index), MS_PER_DAY);
        }
    }

    #[test]
    fn round_trip_every_day_1970_to_2200() {
        let mut expected_days = 0i64;
        for year in 1970..=2200 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    assert_eq!(days_from_civil(year, month, day), expected_days);
                    assert_eq!(civil_from_days(expected_days), (year, month, day));
                    expected_days += 1;
                }
            }
        }
        assert_eq!(expected_days, days_from_civil(2201, 1, 1));
    }

    #[test]
    fn round_trip_proleptic_and_negative_years() {
        let mut expected_days = days_from_civil(-1200, 1, 1);
        for year in -1200..=1969 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    assert_eq!(days_from_civil(year, month, day), expected_days);
                    assert_eq!(civil_from_days(expected_days), (year, month, day));
                    expected_days += 1;
                }
            }
        }
        assert_eq!(expected_days, 0);
        for days in [-1_000_000_000_000, -1, 0, 1, 1_000_000_000_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn until_end_and_index_are_consistent() {
        for period in [CalendarPeriod::Day, CalendarPeriod::Month] {
            let mut now = 0u64;
            // Step through ~250 years in irregular strides.
            while now < midnight(2220, 1, 1) {
                let index = period.index(now);
                let start = period.start(index);
                let end = period.end(index);
                assert!(start <= now && now < end, "{period:?} {now}");
                assert_eq!(period.until_end(now), end - now);
                assert_eq!(period.until_end(end - 1), 1);
                assert_eq!(period.index(end), index + 1);
                now += 7_777_777_777 / if period == CalendarPeriod::Day { 97 } else { 1 };
            }
        }
    }

    #[test]
    fn saturates_at_the_end_of_time() {
        for period in [CalendarPeriod::Day, CalendarPeriod::Month] {
            assert_eq!(period.start(u64::MAX), Millis::MAX);
            assert_eq!(period.end(u64::MAX), Millis::MAX);
            assert_eq!(period.until_end(Millis::MAX), 1);
            assert!(period.until_end(Millis::MAX - 1) >= 1);
            let last = period.index(Millis::MAX);
            // The period containing Millis::MAX starts in range, but its end
            // is not representable.
            assert!(period.start(last) < Millis::MAX);
            assert_eq!(period.end(last), Millis::MAX);
            assert_eq!(period.index(period.start(last)), last);
        }
    }

    #[test]
    #[should_panic(expected = "month must be in 1..=12")]
    fn days_in_month_rejects_bad_month() {
        days_in_month(2024, 13);
    }

    #[test]
    fn leap_years() {
        for (year, leap) in [
            (1900, false),
            (1970, false),
            (1972, true),
            (2000, true),
            (2023, false),
            (2024, true),
            (2100, false),
            (2400, true),
            (0, true),
            (-4, true),
            (-100, false),
        ] {
            assert_eq!(is_leap_year(year), leap, "{year}");
        }
    }

    #[test]
    fn deserializes_lowercase_names() {
        use serde::Deserialize;
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};

        let parse = |s: &'static str| {
            let de: StrDeserializer<'_, Error> = s.into_deserializer();
            CalendarPeriod::deserialize(de)
        };
        assert_eq!(parse("day"), Ok(CalendarPeriod::Day));
        assert_eq!(parse("month"), Ok(CalendarPeriod::Month));
        assert!(parse("Day").is_err());
        assert!(parse("week").is_err());
    }
}
