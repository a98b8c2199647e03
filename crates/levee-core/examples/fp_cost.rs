use levee_core::crdt::*;
use levee_core::NodeIdx;
fn main() {
    for nodes in [2u16, 6] {
        let mut k = KeyCrdt::default();
        for n in 0..nodes {
            *k.buckets.entry(NodeIdx(n)) = BucketReg { seq: 1000 + n as u64, at: 1_700_000_000_000, level_nt: 123456789 };
            *k.demand.entry(NodeIdx(n)) = DemandReg { seq: 3, forecast: 40, received: 4 };
            if n > 0 { k.holdings.give(NodeIdx(n), NodeIdx(0), 500_000); }
        }
        let t = std::time::Instant::now();
        let mut x = 0u64;
        for i in 0..1_000_000u64 { k.buckets.entry(NodeIdx(0)).seq = i; x ^= k.fingerprint(0); }
        println!("{nodes} nodes: {:.0} ns per fingerprint ({x})", t.elapsed().as_nanos() as f64 / 1e6);
    }
}
