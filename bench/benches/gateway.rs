//! Reply generation by the virtual gateway, per request:
//! - Router Solicitation -> Router Advertisement (with the MTU option);
//! - DHCPv4 DISCOVER -> OFFER (routes, DNS, hostname, domain, MTU option 26).
//!
//! Each twice: through `Engine::process_guest` (what a guest's request costs the
//! worker: parse, gateway, reply into the `TxBatch`) and through
//! `gateway::handle_from_guest` alone with pre-parsed metadata (the reply builder).
//! Before measuring, each path is checked to produce exactly one reply frame.

use bench::frames::{dhcp_discover, router_solicitation};
use bench::{TwoSleds, NOW};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use engine::vpc::gateway::{handle_from_guest, GatewayState, GatewayVerdict};
use engine::{TxBatch, TxDest, VnetHdr};
use std::hint::black_box;

fn fixture<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("fixture: {e}"))
}

/// Fails unless `out` holds exactly one frame for the guest's port.
fn one_reply(what: &str, out: &TxBatch, port: engine::PortId) {
    match (out.len(), out.frame(0)) {
        (1, Some((TxDest::Port { port: p, .. }, _))) if p == port => {}
        (n, f) => panic!(
            "{what}: expected one reply to the guest, got {n}: {:?}",
            f.map(|(d, _)| d)
        ),
    }
}

fn gateway(c: &mut Criterion) {
    let mut s = fixture(TwoSleds::new());
    let requests = [
        ("rs_to_ra", fixture(router_solicitation(&s.a.cfg))),
        ("dhcp_discover_to_offer", fixture(dhcp_discover(&s.a.cfg))),
    ];
    let mut g = c.benchmark_group("gateway");
    g.throughput(Throughput::Elements(1));
    let mut out = TxBatch::new();
    for (name, frame) in &requests {
        let a = &mut s.a;
        a.engine
            .process_guest(a.port, VnetHdr::default(), frame, NOW, &a.routes, &mut out);
        one_reply(name, &out, a.port);
        out.clear();
        g.bench_function(format!("process_guest/{name}"), |b| {
            b.iter(|| {
                a.engine.process_guest(
                    a.port,
                    VnetHdr::default(),
                    black_box(frame),
                    NOW,
                    &a.routes,
                    &mut out,
                );
                out.clear();
            });
        });

        let meta = wire::meta::parse_inner(frame)
            .unwrap_or_else(|e| panic!("{name}: request does not parse: {e}"));
        let mut st = GatewayState::new(NOW);
        let verdict = handle_from_guest(&a.cfg, &mut st, a.port, &meta, frame, NOW, &mut out);
        assert_eq!(verdict, GatewayVerdict::Replied, "{name}");
        one_reply(name, &out, a.port);
        out.clear();
        g.bench_function(format!("handle_from_guest/{name}"), |b| {
            b.iter(|| {
                handle_from_guest(
                    &a.cfg,
                    &mut st,
                    a.port,
                    black_box(&meta),
                    black_box(frame),
                    NOW,
                    &mut out,
                );
                out.clear();
            });
        });
    }
    g.finish();
}

criterion_group!(benches, gateway);
criterion_main!(benches);
