//! The routing table the request path reads without the machine's lock ([`Routes`]): a
//! handle taken once, before anything happened, follows every change of reachability the
//! machine makes, and always agrees with the machine's own answer.

mod common;

use common::{Net, replicas};
use levee_cluster::{Route, Routes};
use levee_core::NodeIdx;

/// The first key `k-N` whose owner, with both nodes up, is node 1.
fn key_of_node_1(routes: &Routes) -> String {
    (0..1000)
        .map(|i| format!("k-{i}"))
        .find(|k| routes.route(k.as_bytes()) == Route::Owner(NodeIdx(1)))
        .expect("node 1 owns one of 1,000 keys")
}

#[test]
fn a_handle_taken_at_start_follows_the_owner_going_down_and_coming_back() {
    let mut net = Net::new(replicas(&["eu"], 2), 1_000_000);
    let routes = net.nodes[0].0.routes();
    // Alone at first: every key is decided here, alone (no region-mate heard yet).
    assert_eq!(routes.route(b"k-0"), net.nodes[0].0.route(b"k-0"));
    net.start();
    net.run(200);
    let key = key_of_node_1(&routes);
    let agree = |net: &Net, routes: &Routes| {
        assert_eq!(
            routes.route(key.as_bytes()),
            net.nodes[0].0.route(key.as_bytes()),
            "the handle and the machine disagree at {} ms",
            net.now()
        );
    };
    agree(&net, &routes);
    // Node 1 cut off: past suspect_after (300 ms) its keys are decided here, alone.
    net.isolate(1, true);
    net.run(400);
    assert_eq!(routes.route(key.as_bytes()), Route::Alone);
    assert_eq!(routes.owner(key.as_bytes()), NodeIdx(0));
    agree(&net, &routes);
    // Healed: forwarded to node 1 again.
    net.isolate(1, false);
    net.run(200);
    assert_eq!(routes.route(key.as_bytes()), Route::Owner(NodeIdx(1)));
    agree(&net, &routes);
}
