//! The daemon's edge between the API's types and the engine's.
//!
//! The API (`api`) has types of its own, so that a change inside the engine is not
//! a change of the protocol and a client links no engine. The daemon is the one
//! place where the two meet: what comes in over the API (and from the state file)
//! is turned into the engine's types here, and what the engine reports back into
//! the API's. Both sides have the same meaning field by field; the conversions are
//! total.

/// An API value as the engine takes it.
pub trait ToEngine {
    type Engine;
    fn to_engine(&self) -> Self::Engine;
}

/// An engine value as the API shows it.
pub trait ToApi {
    type Api;
    fn to_api(&self) -> Self::Api;
}

impl ToEngine for api::SnatRange {
    type Engine = engine::SnatRange;
    fn to_engine(&self) -> Self::Engine {
        engine::SnatRange {
            ip: self.ip,
            start: self.start,
            end: self.end,
        }
    }
}

impl ToEngine for api::ExternalIps {
    type Engine = engine::ExternalIps;
    fn to_engine(&self) -> Self::Engine {
        engine::ExternalIps {
            snat: self.snat.as_ref().map(ToEngine::to_engine),
            ephemeral: self.ephemeral,
            floating: self.floating.clone(),
            gateways: self
                .gateways
                .iter()
                .map(|(ip, ids)| {
                    let ids = ids.iter().map(|id| engine::IgwId(id.as_u128())).collect();
                    (*ip, ids)
                })
                .collect(),
        }
    }
}

impl ToEngine for api::PortLimits {
    type Engine = engine::PortLimits;
    fn to_engine(&self) -> Self::Engine {
        engine::PortLimits {
            egress_mbps: self.egress_mbps,
            ingress_mbps: self.ingress_mbps,
            burst_kib: self.burst_kib,
            pps: self.pps,
        }
    }
}

impl ToEngine for api::PortCidrs {
    type Engine = engine::PortCidrs;
    fn to_engine(&self) -> Self::Engine {
        engine::PortCidrs {
            inbound: self.inbound.clone(),
            outbound: self.outbound.clone(),
            external: self.external.clone(),
        }
    }
}

impl ToEngine for api::PortConfig {
    type Engine = engine::PortConfig;
    fn to_engine(&self) -> Self::Engine {
        engine::PortConfig {
            name: self.name.clone(),
            guest_mac: self.guest_mac,
            gateway_mac: self.gateway_mac,
            ipv4: self.ipv4,
            ipv6: self.ipv6,
            vpc_subnet4: self.vpc_subnet4,
            vpc_subnet6: self.vpc_subnet6,
            gateway_ipv4: self.gateway_ipv4,
            vni: self.vni,
            mtu: self.mtu,
            external_jumbo: self.external_jumbo,
            dns_servers4: self.dns_servers4.clone(),
            dns_servers6: self.dns_servers6.clone(),
            hostname: self.hostname.clone(),
            domain: self.domain.clone(),
            domain_search: self.domain_search.clone(),
            external: self.external.to_engine(),
            limits: self.limits.to_engine(),
            cidrs: self.cidrs.to_engine(),
        }
    }
}

impl ToApi for engine::PortState {
    type Api = api::PortState;
    fn to_api(&self) -> api::PortState {
        match self {
            engine::PortState::Ready => api::PortState::Ready,
            engine::PortState::Running => api::PortState::Running,
            engine::PortState::Paused => api::PortState::Paused,
        }
    }
}

impl ToEngine for api::RouteClass {
    type Engine = engine::RouteClass;
    fn to_engine(&self) -> engine::RouteClass {
        match self {
            api::RouteClass::System => engine::RouteClass::System,
            api::RouteClass::Custom => engine::RouteClass::Custom,
        }
    }
}

impl ToApi for engine::RouteClass {
    type Api = api::RouteClass;
    fn to_api(&self) -> api::RouteClass {
        match self {
            engine::RouteClass::System => api::RouteClass::System,
            engine::RouteClass::Custom => api::RouteClass::Custom,
        }
    }
}

impl ToEngine for api::RouteTarget {
    type Engine = engine::RouteTarget;
    fn to_engine(&self) -> engine::RouteTarget {
        match *self {
            api::RouteTarget::Subnet => engine::RouteTarget::VpcSubnet,
            api::RouteTarget::Igw => engine::RouteTarget::InternetGateway(None),
            api::RouteTarget::IgwId(id) => {
                engine::RouteTarget::InternetGateway(Some(engine::IgwId(id.as_u128())))
            }
            api::RouteTarget::Drop => engine::RouteTarget::Drop,
            api::RouteTarget::Ip(a) => engine::RouteTarget::Ip(a),
        }
    }
}

impl ToApi for engine::RouteTarget {
    type Api = api::RouteTarget;
    fn to_api(&self) -> api::RouteTarget {
        match *self {
            engine::RouteTarget::VpcSubnet => api::RouteTarget::Subnet,
            engine::RouteTarget::InternetGateway(None) => api::RouteTarget::Igw,
            engine::RouteTarget::InternetGateway(Some(id)) => {
                api::RouteTarget::IgwId(api::Uuid::from_u128(id.0))
            }
            engine::RouteTarget::Drop => api::RouteTarget::Drop,
            engine::RouteTarget::Ip(a) => api::RouteTarget::Ip(a),
        }
    }
}

impl ToEngine for api::V2bEntry {
    type Engine = engine::V2bEntry;
    fn to_engine(&self) -> Self::Engine {
        engine::V2bEntry {
            prefix: self.prefix,
            endpoints: self.endpoints.clone(),
        }
    }
}

impl ToApi for engine::V2bEntry {
    type Api = api::V2bEntry;
    fn to_api(&self) -> api::V2bEntry {
        api::V2bEntry {
            prefix: self.prefix,
            endpoints: self.endpoints.clone(),
        }
    }
}

impl<T: ToEngine> ToEngine for [T] {
    type Engine = Vec<T::Engine>;
    fn to_engine(&self) -> Vec<T::Engine> {
        self.iter().map(ToEngine::to_engine).collect()
    }
}

impl<T: ToApi> ToApi for [T] {
    type Api = Vec<T::Api>;
    fn to_api(&self) -> Vec<T::Api> {
        self.iter().map(ToApi::to_api).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two forms of a port serialise alike, so `list-ports --json`, the state
    /// file and the engine's own dumps name the same fields the same way.
    #[test]
    fn a_port_converts_field_by_field() {
        let mut cfg = api::testing::sample_port("opte0", 5);
        cfg.external = api::ExternalIps {
            snat: Some(api::SnatRange {
                ip: "198.51.100.1".parse().unwrap(),
                start: 1024,
                end: 2047,
            }),
            ephemeral: Some("198.51.100.7".parse().unwrap()),
            floating: vec!["192.0.2.5".parse().unwrap()],
            gateways: [(
                "192.0.2.5".parse().unwrap(),
                ["0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a".parse().unwrap()].into(),
            )]
            .into(),
        };
        cfg.limits.egress_mbps = Some(100);
        cfg.cidrs.inbound.push("10.9.0.0/16".parse().unwrap());
        let ours = serde_json::to_value(&cfg).unwrap();
        let engines = serde_json::to_value(cfg.to_engine()).unwrap();
        assert_eq!(ours, engines);
    }

    #[test]
    fn routes_and_states_convert_both_ways() {
        for t in [
            api::RouteTarget::Subnet,
            api::RouteTarget::Igw,
            api::RouteTarget::Drop,
            api::RouteTarget::Ip("10.0.0.5".parse().unwrap()),
            api::RouteTarget::IgwId("0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a".parse().unwrap()),
        ] {
            assert_eq!(t.to_engine().to_api(), t);
        }
        for c in [api::RouteClass::System, api::RouteClass::Custom] {
            assert_eq!(c.to_engine().to_api(), c);
        }
        assert_eq!(
            engine::PortState::Paused.to_api().to_string(),
            engine::PortState::Paused.to_string()
        );
    }
}
