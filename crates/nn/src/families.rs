//! The registry of convolution families: the one file that lists them. Each family states
//! what it is in its own file under `families/` ([`crate::conv::Family`],
//! [`crate::conv::Conv`]); here its module is declared and a [`Kind`] names it (in configs and
//! model files) and finds its family and its layers.

use grinnder_tensor::Backend;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::conv::{Conv, Family, LayerSpec};

pub mod gat;
pub mod gatv2;
pub mod gcn;
pub mod gcn2;
pub mod gin;
pub mod layerwise;
pub mod sage;

/// A convolution family, by name (in configs and model files its [`Family::name`], read
/// with its aliases in any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gcn,
    Sage,
    Gat,
    Gin,
    Gatv2,
    Gcnii,
    /// A layer-wise model whose layers the caller made ([`layerwise`]), on an aggregation's
    /// adjacency: not a family one can name on the command line or in a model file (it is not
    /// in [`Kind::ALL`]).
    Layerwise(crate::Aggregation),
}

impl Kind {
    /// Every family.
    pub const ALL: [Kind; 6] = [Kind::Gcn, Kind::Sage, Kind::Gat, Kind::Gin, Kind::Gatv2, Kind::Gcnii];

    /// What the family states about itself.
    pub fn family(self) -> &'static dyn Family {
        match self {
            Kind::Gcn => &gcn::Gcn,
            Kind::Sage => &sage::Sage,
            Kind::Gat => &gat::Gat,
            Kind::Gin => &gin::Gin,
            Kind::Gatv2 => &gatv2::Gatv2,
            Kind::Gcnii => &gcn2::Gcnii,
            Kind::Layerwise(a) => layerwise::on(a),
        }
    }

    /// A layer of this family as `spec` describes it; `None` for [`Kind::Layerwise`], whose
    /// layers only their caller makes ([`crate::Model::from_layers`]).
    pub fn conv<B: Backend>(self, b: &B, spec: &LayerSpec) -> Option<Box<dyn Conv<B>>> {
        Some(match self {
            Kind::Gcn => Box::new(gcn::GcnConv::of(b, spec)),
            Kind::Sage => Box::new(sage::SageConv::of(b, spec)),
            Kind::Gat => Box::new(gat::GatConv::of(b, spec)),
            Kind::Gin => Box::new(gin::GinConv::of(b, spec)),
            Kind::Gatv2 => Box::new(gatv2::Gatv2Conv::of(b, spec)),
            Kind::Gcnii => Box::new(gcn2::GcniiConv::of(b, spec)),
            Kind::Layerwise(_) => return None,
        })
    }

    /// The family's name: `gcn`, `sage`, `gat`, `gin`, `gatv2`, `gcnii`.
    pub fn name(self) -> &'static str {
        self.family().name()
    }

    /// The family named `s` (any case; or one of its aliases: `graphsage` for SAGE).
    pub fn parse(s: &str) -> Option<Kind> {
        let s = s.to_ascii_lowercase();
        Kind::ALL.into_iter().find(|k| {
            let f = k.family();
            f.name() == s || f.aliases().contains(&s.as_str())
        })
    }

    /// The family whose first layer a state dict holds (`has(name)`: whether it holds that
    /// tensor): of the families whose markers ([`Family::markers`]) are all there, the one
    /// with the most (GAT's `lin.weight` is GCN's name too; its attention vectors tell it
    /// apart).
    pub fn recognise(has: impl Fn(&str) -> bool) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .map(|k| (k, k.family().markers()))
            .filter(|(_, m)| m.iter().all(|n| has(n)))
            .max_by_key(|(_, m)| m.len())
            .map(|(k, _)| k)
    }
}

impl std::fmt::Display for Kind {
    /// As the command line takes it ([`Kind::name`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Kind::parse(&s).ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            serde::de::Error::custom(format!("unknown model `{s}`: one of {}", names.join(", ")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_state_dicts_tell_the_family() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()), Some(k));
            assert_eq!(Kind::parse(&k.name().to_uppercase()), Some(k));
            let names = k.family().markers();
            assert_eq!(Kind::recognise(|n| names.iter().any(|m| m == n)), Some(k), "{k:?}");
        }
        // GAT's markers hold GCN's: GCN's alone is GCN
        assert_eq!(Kind::recognise(|n| n == "convs.0.lin.weight"), Some(Kind::Gcn));
        assert_eq!(Kind::parse("GraphSAGE"), Some(Kind::Sage));
        assert_eq!(Kind::parse("mlp"), None);
        assert_eq!(Kind::recognise(|_| false), None);
    }

    #[test]
    fn every_family_has_its_own_name_and_markers() {
        for (i, a) in Kind::ALL.iter().enumerate() {
            for b in &Kind::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
                assert_ne!(a.family().markers(), b.family().markers(), "{a} and {b}");
            }
        }
    }
}
