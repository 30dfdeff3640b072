//! Model files: bytes round trips, architectures read from tensors, refusals.

use super::*;

fn arch(kind: Kind) -> Arch {
    let a = Arch {
        kind,
        layers: 2,
        hidden: 4,
        heads: 2,
        norm: Norm::Layer,
        residual: false,
        gin_eps: 0.25,
        train_eps: false,
        alpha: 0.2,
        theta: 1.5,
        in_features: 5,
        classes: 3,
        feature_norm: FeatureNorm::Row,
        feature_shift: -0.5,
        graph: Some(GraphKind { directed: true, edge_weight: true }),
    };
    // heads only where the family has them
    Arch { heads: a.model_config().heads_of_hidden(), ..a }
}

fn file(kind: Kind) -> ModelFile {
    let a = arch(kind);
    let b = grinnder_tensor::Cpu::<f32>::new();
    let mut m = Model::init(&b, a.model_config(), a.in_features, a.classes);
    ModelFile::capture(&b, &mut m, a, Some("last epoch".into()))
}

#[test]
fn a_model_with_many_more_classes_than_hidden_units_reads_back() {
    // papers100M's 172 classes under 16 hidden units: the size check once counted an o × o
    // term per layer (GIN's) and refused grinnder's own GCN file
    for kind in Kind::ALL {
        let a = Arch { hidden: 16, in_features: 128, classes: 172, norm: Norm::None, ..arch(kind) };
        let b = grinnder_tensor::Cpu::<f32>::new();
        let mut m = Model::init(&b, a.model_config(), a.in_features, a.classes);
        let f = ModelFile::capture(&b, &mut m, a, None);
        let back = ModelFile::from_bytes(&f.to_bytes().unwrap(), Path::new("m.safetensors"));
        assert!(back.is_ok(), "{kind}: {}", back.unwrap_err());
    }
}

#[test]
fn every_model_round_trips_through_bytes() {
    for kind in Kind::ALL {
        let f = file(kind);
        let back = ModelFile::from_bytes(&f.to_bytes().unwrap(), Path::new("m.safetensors")).unwrap();
        assert_eq!(back, ModelFile { path: Some("m.safetensors".into()), ..f }, "{kind:?}");
    }
}

#[test]
fn the_architecture_is_read_from_the_tensors_without_metadata() {
    for kind in Kind::ALL {
        let f = file(kind);
        let views: Vec<(String, Vec<u8>, Vec<usize>)> = f
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.data.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
                    t.shape.clone(),
                )
            })
            .collect();
        let bytes = safetensors::serialize(
            views.iter().map(|(n, b, s)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())),
            None,
        )
        .unwrap();
        let back = ModelFile::from_bytes(&bytes, Path::new("pyg.safetensors")).unwrap();
        let want = Arch { feature_norm: FeatureNorm::None, feature_shift: 0.0, graph: None, ..arch(kind) };
        // ε is read from the eps tensor where the family has one
        let has_eps = f.tensors.iter().any(|t| t.name.ends_with(".eps"));
        let want = if has_eps { want } else { Arch { gin_eps: 0.0, ..want } };
        // α and θ are in no tensor: PyG's example's values
        let want = Arch { alpha: DEFAULT_ALPHA, theta: DEFAULT_THETA, ..want };
        assert_eq!(back.arch, want, "{kind:?}");
        assert_eq!(back.tensors, f.tensors);
    }
}

#[test]
fn a_cut_or_changed_file_is_refused_naming_the_tensor() {
    let f = file(Kind::ALL[0]);
    let bytes = f.to_bytes().unwrap();
    let p = Path::new("m.safetensors");
    let err = ModelFile::from_bytes(&bytes[..bytes.len() - 7], p).unwrap_err().to_string();
    assert!(err.contains("cut short") && err.contains("tensor "), "{err}");
    // the last value of the data section changed
    let mut changed = bytes.clone();
    let n = changed.len();
    changed[n - 1] ^= 0x40;
    let err = ModelFile::from_bytes(&changed, p).unwrap_err().to_string();
    assert!(err.contains("checksum") && err.contains("tensor "), "{err}");
    let err = ModelFile::from_bytes(&bytes[..5], p).unwrap_err().to_string();
    assert!(err.contains("shorter than a safetensors header"), "{err}");
}

/// `bytes` with its metadata edited by `edit`; `seal`: with a `checksum` recomputed over
/// the edit (as a writer who knows the format would), else without one.
fn edited(bytes: &[u8], edit: impl Fn(&mut HashMap<String, String>), seal: bool) -> Vec<u8> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let (_, m) = SafeTensors::read_metadata(bytes).unwrap();
    let mut meta = m.metadata().clone().unwrap();
    edit(&mut meta);
    meta.remove("checksum");
    let views = st.tensors();
    if seal {
        let s = check::seal(
            &meta,
            views.iter().map(|(n, v)| (n.as_str(), format!("{:?}", v.dtype()), v.shape())),
        );
        meta.insert("checksum".into(), s);
    }
    safetensors::serialize(views, Some(meta)).unwrap()
}

#[test]
fn metadata_sizes_the_tensors_contradict_are_refused_before_a_model_is_made() {
    let p = Path::new("m.safetensors");
    let huge = [(1u64 << 40).to_string(), (1u64 << 62).to_string(), u64::MAX.to_string()];
    for kind in Kind::ALL {
        let bytes = file(kind).to_bytes().unwrap();
        let mut cases: Vec<(&str, String)> =
            vec![("layers", "0".into()), ("layers", "1000000".into()), ("hidden", "0".into())];
        for key in ["layers", "hidden", "heads", "in_features", "classes"] {
            cases.extend(huge.iter().map(|v| (key, v.clone())));
        }
        cases.extend([("gin_eps", "NaN".into()), ("gin_eps", "inf".into()), ("feature_shift", "NaN".into())]);
        // GCNII's α outside [0, 1], θ negative or not finite
        cases.extend(["1.5", "-0.1", "NaN"].map(|v| ("alpha", v.to_string())));
        cases.extend(["-1", "inf", "NaN"].map(|v| ("theta", v.to_string())));
        for (key, value) in &cases {
            for seal in [false, true] {
                let b = edited(&bytes, |m| drop(m.insert(key.to_string(), value.clone())), seal);
                let got = ModelFile::from_bytes(&b, p);
                // heads of a family without them is never read: the file is the same model
                // (without its checksum it is refused for that alone)
                if seal && key == &"heads" && kind.family().heads_tensor(0).is_none() {
                    assert_eq!(got.unwrap().tensors, file(kind).tensors, "{kind:?} {key}={value}");
                    continue;
                }
                let err = got.expect_err(&format!("{kind:?} {key}={value} sealed {seal}")).to_string();
                assert!(err.contains("metadata"), "{kind:?} {key}={value}: {err}");
            }
        }
    }
}

#[test]
fn edited_metadata_is_refused_by_the_checksum() {
    let p = Path::new("m.safetensors");
    let bytes = file(Kind::parse("gcn").unwrap()).to_bytes().unwrap();
    type Edit = Box<dyn Fn(&mut HashMap<String, String>)>;
    let edits: [(&str, Edit); 4] = [
        ("feature_shift", Box::new(|m| drop(m.insert("feature_shift".into(), "1".into())))),
        ("feature_norm", Box::new(|m| drop(m.insert("feature_norm".into(), "none".into())))),
        ("residual", Box::new(|m| drop(m.insert("residual".into(), "true".into())))),
        (
            "renamed",
            Box::new(|m| {
                let v = m.remove("feature_norm").unwrap();
                m.insert("feature_normalisation".into(), v);
            }),
        ),
    ];
    for (what, edit) in edits {
        // the checksum kept as it was
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (_, m) = SafeTensors::read_metadata(&bytes).unwrap();
        let mut meta = m.metadata().clone().unwrap();
        edit(&mut meta);
        let b = safetensors::serialize(st.tensors(), Some(meta)).unwrap();
        let err = ModelFile::from_bytes(&b, p).unwrap_err().to_string();
        assert!(err.contains("changed after grinnder saved it"), "{what}: {err}");
    }
    // an unknown entry in a file grinnder wrote, even without the checksum
    let b = edited(&bytes, |m| drop(m.insert("feature_normalisation".into(), "row".into())), false);
    let err = ModelFile::from_bytes(&b, p).unwrap_err().to_string();
    assert!(err.contains("feature_normalisation") && err.contains("not an entry grinnder writes"), "{err}");
}

#[test]
fn a_grinnder_file_without_its_checksum_is_refused_unless_asked_for() {
    let p = Path::new("m.safetensors");
    let bytes = file(Kind::parse("gcn").unwrap()).to_bytes().unwrap();
    // the checksum removed and a value that changes predictions edited, as a file written
    // before the checksum existed would look
    let b = edited(&bytes, |m| drop(m.insert("feature_shift".into(), "1".into())), false);
    let err = ModelFile::from_bytes(&b, p).unwrap_err().to_string();
    assert!(err.contains("metadata checksum") && err.contains(check::UNSEALED_VAR), "{err}");
    let (_, m) = SafeTensors::read_metadata(&b).unwrap();
    let st = SafeTensors::deserialize(&b).unwrap();
    let views = st.tensors();
    let tensors = || views.iter().map(|(n, v)| (n.as_str(), format!("{:?}", v.dtype()), v.shape()));
    let meta = m.metadata().clone().unwrap();
    assert!(check::metadata_with(&meta, tensors(), p, true).is_ok(), "accepted when asked for");
    // a file of another producer (no grinnder entries) needs no checksum
    let foreign: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    assert!(check::metadata_with(&foreign, tensors(), p, false).is_ok());
}

#[test]
fn every_one_bit_change_of_the_header_is_refused_or_changes_nothing() {
    let p = Path::new("m.safetensors");
    for kind in ["gcn", "gat"].map(|k| Kind::parse(k).unwrap()) {
        let f = file(kind);
        let bytes = f.to_bytes().unwrap();
        let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut accepted = 0;
        for bit in 0..header * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            if let Ok(back) = ModelFile::from_bytes(&b, p) {
                accepted += 1;
                assert_eq!((&back.arch, &back.tensors), (&f.arch, &f.tensors), "{kind:?} bit {bit}");
            }
        }
        // JSON's insignificant bits (the padding's spaces) may change; nothing else
        eprintln!("{kind:?}: {accepted} of {} one-bit changes of the header accepted, unchanged", header * 8);
        assert!(accepted < header, "{kind:?}: {accepted} of {} flips accepted", header * 8);
    }
}

#[test]
fn a_file_longer_or_shorter_than_its_header_says_is_refused_before_its_data_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = file(Kind::parse("sage").unwrap()).to_bytes().unwrap();
    let p = dir.path().join("m.safetensors");
    std::fs::write(&p, &bytes).unwrap();
    assert!(ModelFile::load(&p).is_ok());
    // sparse: 3.5 GB of holes after the tensors, refused from the header alone
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(bytes.len() as u64 + (3_500u64 << 20)).unwrap();
    let err = ModelFile::load(&p).unwrap_err().to_string();
    assert!(err.contains("bytes follow its last tensor's data"), "{err}");
    f.set_len(bytes.len() as u64 - 9).unwrap();
    let err = ModelFile::load(&p).unwrap_err().to_string();
    assert!(err.contains("cut short") && err.contains("tensor "), "{err}");
    // a header length past the file
    let mut b = bytes.clone();
    b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let err = ModelFile::load(&p).unwrap_err().to_string();
    assert!(err.contains("its header claims"), "{err}");
}

#[test]
fn a_file_for_another_model_names_the_first_tensor_that_differs() {
    let f = file(Kind::parse("sage").unwrap());
    let other = Arch { hidden: 8, ..f.arch.clone() };
    let b = grinnder_tensor::Cpu::<f32>::new();
    let mut m = Model::init(&b, other.model_config(), 5, 3);
    let err = f.apply(&b, &mut m, Path::new("m.safetensors")).unwrap_err().to_string();
    assert!(
        err.contains("convs.0.lin_l.weight") && err.contains("[4, 5]") && err.contains("[8, 5]"),
        "{err}"
    );
}
