//! A model family in PyG's terms: its name on the command line and in model files, and how a
//! PyG `state_dict` shows it — which first-layer tensor names the family has, and which
//! tensors carry a layer's input and output widths — so that code reading a model file asks
//! the family instead of matching on it.

use crate::model::Kind;

impl Kind {
    /// Every family.
    pub const ALL: [Kind; 4] = [Kind::Gcn, Kind::Sage, Kind::Gat, Kind::Gin];

    /// The family's name: `gcn`, `sage`, `gat`, `gin`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Gcn => "gcn",
            Kind::Sage => "sage",
            Kind::Gat => "gat",
            Kind::Gin => "gin",
        }
    }

    /// The family named `s` (any case; `graphsage` for SAGE).
    pub fn parse(s: &str) -> Option<Kind> {
        match s.to_ascii_lowercase().as_str() {
            "graphsage" => Some(Kind::Sage),
            s => Kind::ALL.into_iter().find(|k| k.name() == s),
        }
    }

    /// The tensor of layer `l` whose shape is `[output width, input width]`: its first linear
    /// map (`convs.{l}.lin.weight`, `lin_l.weight`, `nn.0.weight`).
    pub fn first_map(self, l: usize) -> String {
        match self {
            Kind::Gcn | Kind::Gat => format!("convs.{l}.lin.weight"),
            Kind::Sage => format!("convs.{l}.lin_l.weight"),
            Kind::Gin => format!("convs.{l}.nn.0.weight"),
        }
    }

    /// The tensor of layer `l` whose first dimension is the layer's output width (GAT: the
    /// bias, whose width is the output's whether heads are concatenated or averaged).
    pub fn output_map(self, l: usize) -> String {
        match self {
            Kind::Gin => format!("convs.{l}.nn.2.weight"),
            Kind::Gat => format!("convs.{l}.bias"),
            k => k.first_map(l),
        }
    }

    /// The family whose first layer a state dict holds (`has(name)`: whether it holds that
    /// tensor); families whose names overlap are told apart by the one only they have.
    pub fn recognise(has: impl Fn(&str) -> bool) -> Option<Kind> {
        // GAT's `lin.weight` is GCN's name too: its attention vectors tell it apart
        [Kind::Sage, Kind::Gat, Kind::Gin, Kind::Gcn].into_iter().find(|k| match k {
            Kind::Gat => has("convs.0.att_src"),
            k => has(&k.first_map(0)),
        })
    }

    /// The tensor whose second dimension is the attention heads of a layer (`None`: the
    /// family has no heads).
    pub fn heads_tensor(self, l: usize) -> Option<String> {
        (self == Kind::Gat).then(|| format!("convs.{l}.att_src"))
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
            let names = match k {
                Kind::Gat => vec!["convs.0.lin.weight".to_string(), "convs.0.att_src".into()],
                k => vec![k.first_map(0)],
            };
            assert_eq!(Kind::recognise(|n| names.iter().any(|m| m == n)), Some(k), "{k:?}");
        }
        assert_eq!(Kind::parse("GraphSAGE"), Some(Kind::Sage));
        assert_eq!(Kind::parse("mlp"), None);
        assert_eq!(Kind::recognise(|_| false), None);
    }
}
