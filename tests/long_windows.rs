//! Long windows (a day quota) across a crash: what a key's owner that dies holding most of
//! the day's rights strands, and for how long (issue #13, "dead nodes do not strand long
//! windows"). Real `levee serve` processes on loopback; the harness is `tests/harness/`.

#[allow(
    dead_code,
    reason = "shared by the cluster tests, each of which uses part of it"
)]
mod harness;

use std::time::{Duration, Instant};

use harness::*;

/// Checks of `rule`/`key` round robin over `nodes` until the cluster admits no more: every
/// node of a round denies with a `retry_after_ms` beyond a minute (the rights of the day are
/// spent or out of reach), or `limit` are admitted, or `within` passes. A denial with a short
/// retry is waited out. Returns the admissions.
fn admit_until_spent(
    c: &LocalClusterHandle,
    nodes: &[usize],
    rule: &str,
    key: &str,
    limit: u64,
    within: Duration,
) -> u64 {
    let deadline = Instant::now() + within;
    let mut admitted = 0u64;
    while admitted < limit && Instant::now() < deadline {
        let mut spent_everywhere = true;
        let mut shortest = u64::MAX;
        for &n in nodes {
            let r = c.check(n, rule, key);
            if r.allowed() {
                admitted += 1;
                spent_everywhere = false;
                continue;
            }
            let retry = r.json["retry_after_ms"].as_u64().unwrap_or(u64::MAX);
            if retry <= 60_000 {
                spent_everywhere = false;
                shortest = shortest.min(retry);
            }
        }
        if spent_everywhere {
            break;
        }
        if shortest < u64::MAX {
            std::thread::sleep(Duration::from_millis(shortest.clamp(1, 1_000)));
        }
    }
    admitted
}

/// eu-2 owns a day-quota key and has gathered its region's rights of it when it is killed
/// (`kill -9`): while it is down the others admit only what they hold, and the rest of the
/// day's limit is stranded with it; restarted on its data directory, it pulls its own state
/// back from its peers, and the cluster admits exactly the day's limit.
#[test]
fn rights_a_crashed_owner_held_of_a_day_quota_come_back_when_it_restarts() {
    let mut c = LocalClusterHandle::start_layout(&["eu", "us"], 2, None);
    let [eu1, eu2, us1, us2] = [0, 1, 2, 3];
    let rule = "daily";
    let key = c.day_key_held_by_eu2("crashed-owner", BEFORE);
    let key = key.as_str();

    c.kill9(eu2);
    let down = Instant::now();
    let during = admit_until_spent(
        &c,
        &[eu1, us1, us2],
        rule,
        key,
        DAILY_LIMIT,
        Duration::from_secs(20),
    );
    let stranded = DAILY_LIMIT - BEFORE - during;
    c.start_node(eu2);
    let downtime = down.elapsed();
    let after = admit_until_spent(
        &c,
        &[eu1, eu2, us1, us2],
        rule,
        key,
        DAILY_LIMIT,
        Duration::from_secs(20),
    );
    eprintln!(
        "admitted {BEFORE} before eu-2 was killed, {during} while it was down ({stranded} of the day's {DAILY_LIMIT} stranded with it for {downtime:?}), {after} once it was back"
    );
    assert!(
        during < DAILY_LIMIT - BEFORE,
        "nothing was stranded with the dead owner ({during} admitted while it was down): the test does not test what it says"
    );
    assert_eq!(
        BEFORE + during + after,
        DAILY_LIMIT,
        "{BEFORE} before, {during} while eu-2 was down, {after} after its restart"
    );
    let all = [eu1, eu2, us1, us2];
    c.wait_agreement(&all, rule, key, READY_TIMEOUT, |v| v.used == DAILY_LIMIT);
}

/// eu-2 owns a day-quota key, has gathered its region's rights of it and admitted `BEFORE`
/// (every live node's view says so) when it is killed (`kill -9`) and then removed from the
/// list. Returns the key and how long after the kill the removal was agreed.
fn remove_dead_owner(c: &mut LocalClusterHandle, prefix: &str) -> (String, Duration) {
    let [eu1, eu2, us1, us2] = [0, 1, 2, 3];
    let key = c.day_key_held_by_eu2(prefix, BEFORE);
    let live = [eu1, us1, us2];
    c.wait_agreement(&live, "daily", &key, READY_TIMEOUT, |v| v.used == BEFORE);
    c.kill9(eu2);
    let down = Instant::now();
    let removed = [(eu1, false), (eu2, true), (us1, false), (us2, false)];
    c.change_list(&removed, &live, true);
    c.wait_agreed(&live);
    (key, down.elapsed())
}

/// What the owner admitted before it was killed, in the removal tests.
const BEFORE: u64 = 50;

/// eu-2 owns a day-quota key and has gathered its region's rights of it when it is killed
/// (`kill -9`) and then removed from the list: eu-1, its region-mate, takes over what eu-2
/// held and did not use (`Rule::bequests`), so the cluster still admits exactly the day's
/// limit. Without that, eu-2's unspent rights would stay out of service until eu-1's grown
/// share applied, the day after next (docs/membership.md).
#[test]
fn rights_a_crashed_owner_held_of_a_day_quota_serve_its_region_once_it_is_removed() {
    let mut c = LocalClusterHandle::start_layout(&["eu", "us"], 2, None);
    let (key, removed_after) = remove_dead_owner(&mut c, "removed-owner");
    eprintln!("eu-2 was removed {removed_after:?} after it was killed");
    the_live_nodes_admit_the_rest_of_the_day(&c, &key, "its removal");
}

/// eu-1, us-1 and us-2 admit until the cluster admits no more: the rest of the day's limit
/// after the `BEFORE` eu-2 admitted, no more and no less, and every view says so.
fn the_live_nodes_admit_the_rest_of_the_day(c: &LocalClusterHandle, key: &str, after_what: &str) {
    let (live, rule) = ([0, 2, 3], "daily");
    let after = admit_until_spent(c, &live, rule, key, DAILY_LIMIT, Duration::from_secs(20));
    eprintln!(
        "admitted {BEFORE} before eu-2 was killed, then {after} after {after_what} (limit {DAILY_LIMIT}, {} stranded)",
        i128::from(DAILY_LIMIT) - i128::from(BEFORE + after)
    );
    for i in live {
        eprintln!("{}: {}", c.id(i), c.usage(i, rule, key));
    }
    assert_eq!(
        BEFORE + after,
        DAILY_LIMIT,
        "{BEFORE} before eu-2 was killed, {after} after {after_what}"
    );
    c.wait_agreement(&live, rule, key, READY_TIMEOUT, |v| v.used == DAILY_LIMIT);
}

/// As above, but eu-1, the heir, is killed and restarted once the removal is agreed, before
/// anything more is admitted. A node that starts with removed nodes in its list holds its
/// shares as a running node does when the removal reaches it (`RuleSet::starting`), so the
/// restarted heir takes over what eu-2 left again once it has pulled its peers' state.
/// Before, it bound the new list in full and forgot the bequest: the region's own share
/// served (eu-1 had given its part to the owner), and what eu-2 held stayed out of service
/// until the day after next.
#[test]
fn a_restarted_heir_still_serves_what_a_removed_owner_left_of_a_day_quota() {
    let mut c = LocalClusterHandle::start_layout(&["eu", "us"], 2, None);
    let eu1 = 0;
    let (key, _) = remove_dead_owner(&mut c, "heir-restarts");
    c.kill9(eu1);
    c.start_node(eu1);
    the_live_nodes_admit_the_rest_of_the_day(&c, &key, "its removal and eu-1's restart");
}
