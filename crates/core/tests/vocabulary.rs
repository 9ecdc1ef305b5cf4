//! The generic band rules against the vendored llama.cpp's own vocabulary: every tensor-name token
//! of `LLM_TENSOR_NAMES` (src/llama-arch.cpp), read from the source at test time, has a band.

use std::path::PathBuf;

use opledger_core::band::BandRules;

/// The version of llama-cpp-sys-2 the workspace pins (`llama-cpp-sys-2 = { version = "=X" }`).
fn pinned_version() -> String {
    let manifest =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml"))
            .expect("the workspace Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("llama-cpp-sys-2"))
        .expect("llama-cpp-sys-2 in the workspace dependencies");
    let start = line.find("\"=").expect("a pinned version") + 2;
    let end = line[start..].find('"').expect("a closing quote") + start;
    line[start..end].to_string()
}

/// `src/llama-arch.cpp` of the vendored llama.cpp, where cargo unpacked the crate.
fn llama_arch_cpp() -> PathBuf {
    let version = pinned_version();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cargo"));
    let registry = cargo_home.join("registry").join("src");
    let found = std::fs::read_dir(&registry)
        .unwrap_or_else(|e| panic!("{}: {e}", registry.display()))
        .flatten()
        .map(|d| {
            d.path()
                .join(format!("llama-cpp-sys-2-{version}"))
                .join("llama.cpp/src/llama-arch.cpp")
        })
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!(
            "no llama-cpp-sys-2-{version}/llama.cpp/src/llama-arch.cpp under {} (the build \
             unpacks it; run `cargo build` first)",
            registry.display()
        )
    })
}

/// The tokens of `LLM_TENSOR_NAMES`: each entry `{ LLM_TENSOR_X, "blk.%d.attn_q" },` gives
/// `attn_q` (the format without `blk.%d.` / `enc.` / `dec.` prefixes; WavTokenizer's
/// `posnet.%d.x` and `convnext.%d.x` give `posnet.x`, `convnext.x`).
fn tensor_tokens(text: &str) -> Vec<String> {
    let start = text
        .find("LLM_TENSOR_NAMES = {")
        .expect("the LLM_TENSOR_NAMES table");
    let end = text[start..].find("};").expect("the table's end") + start;
    let mut tokens = Vec::new();
    for line in text[start..end].lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix('{') else {
            continue;
        };
        let Some((name, fmt)) = rest.split_once(',') else {
            continue;
        };
        if !name.trim().starts_with("LLM_TENSOR_") {
            continue;
        }
        let Some(q0) = fmt.find('"') else { continue };
        let Some(q1) = fmt[q0 + 1..].find('"') else {
            continue;
        };
        let fmt = &fmt[q0 + 1..q0 + 1 + q1];
        let fmt = fmt
            .strip_prefix("dec.")
            .or_else(|| fmt.strip_prefix("enc."))
            .unwrap_or(fmt);
        let token = fmt
            .strip_prefix("blk.%d.")
            .map(str::to_string)
            .unwrap_or_else(|| fmt.replace(".%d.", "."));
        if !tokens.contains(&token) {
            tokens.push(token);
        }
    }
    tokens
}

#[test]
fn every_tensor_name_token_of_llama_arch_cpp_has_a_band() {
    let path = llama_arch_cpp();
    let text = std::fs::read_to_string(&path).unwrap();
    let tokens = tensor_tokens(&text);
    // the table of this llama.cpp holds some 270 distinct tokens; a parse that finds far fewer
    // read the wrong thing
    assert!(
        tokens.len() > 200,
        "{} tokens in {}",
        tokens.len(),
        path.display()
    );
    assert!(tokens.iter().any(|t| t == "attn_qkv"));
    assert!(tokens.iter().any(|t| t == "ffn_gate_exps"));
    let rules = BandRules::generic().unwrap();
    let missing: Vec<&String> = tokens
        .iter()
        .filter(|t| !rules.weight.contains_key(t.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} tensor-name tokens of {} have no band in bands/generic.toml: {missing:?}",
        missing.len(),
        tokens.len(),
        path.display()
    );
}

#[test]
fn the_layer_dependent_tokens_follow_the_layer_kind() {
    use opledger_core::arch::LayerKind;
    let rules = BandRules::generic().unwrap();
    // attention-side weights of a recurrent layer are the recurrent mixer's own
    let linear = &rules.weight_by_layer[&LayerKind::LinearAttention];
    for t in ["attn_norm", "attn_qkv", "attn_gate", "attn_output"] {
        assert_eq!(linear[t], "linear_attention", "{t}");
        assert_eq!(rules.weight[t], "projections", "{t}");
    }
    // the FFN norm goes with the layer's FFN, MoE or dense
    assert_eq!(rules.weight["ffn_norm"], opledger_core::band::FFN_OF_LAYER);
}
