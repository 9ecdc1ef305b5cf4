//! The architectures the linked llama.cpp knows (`LLM_ARCH_NAMES`, `src/llama-arch.cpp` of
//! llama-cpp-sys-2 0.1.161) and which of them it loads as a model; the tests compare these lists
//! with the vendored source.

/// The pinned llama-cpp-sys-2 whose llama.cpp these lists describe (the workspace's Cargo.toml).
pub const LLAMA_CPP_SYS_VERSION: &str = "0.1.161";

/// Every name in `LLM_ARCH_NAMES`, in the table's order (`"(unknown)"` included: llama.cpp maps
/// every name it does not know to it).
#[rustfmt::skip]
pub const LLAMA_ARCH_NAMES: [&str; 155] = [
    "clip", "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt",
    "baichuan", "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe",
    "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2",
    "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35",
    "qwen35moe", "clef", "qwen4exp", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3",
    "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3",
    "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba", "mamba2",
    "maple", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo",
    "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr",
    "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder",
    "jais", "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe",
    "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid",
    "graniteswitch", "granite_swa", "chameleon", "wavtokenizer-dec", "plm", "bailingmoe",
    "bailingmoe2", "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe", "laguna", "ernie4_5",
    "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3", "hy_v4", "smollm3",
    "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe", "seed_oss",
    "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
    "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35",
    "spark2_5", "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie",
    "mellum", "nanbeige", "qwen3tts", "pockettts", "(unknown)",
];

/// The names llama.cpp knows but does not load as a model, and why.
const NOT_LOADABLE: [(&str, &str); 3] = [
    (
        "clip",
        "a vision projector: llama.cpp refuses it as a model ('CLIP cannot be used as main model, \
         use it with --mmproj instead', src/llama.cpp)",
    ),
    (
        "gptj",
        "named in llama.cpp's table but without a model class: it refuses the file ('unsupported \
         model architecture', llama_model_mapping in src/llama-model.cpp)",
    ),
    (
        "(unknown)",
        "llama.cpp's name for an architecture it does not know: it refuses the file",
    ),
];

/// `llm_arch_is_recurrent` (src/llama-arch.cpp): every layer is recurrent, none attends.
pub const RECURRENT_ARCHS: [&str; 6] =
    ["mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"];

/// `llm_arch_is_hybrid` (src/llama-arch.cpp): recurrent and attention layers mixed, which layer
/// is which decided by the metadata (a head count of 0 marks a recurrent layer in some).
#[rustfmt::skip]
pub const HYBRID_ARCHS: [&str; 18] = [
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35",
    "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
];

/// What the linked llama.cpp does with a file of some architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlamaSupport {
    /// It creates a model of this architecture.
    Loads,
    /// It knows the name but refuses the file (the reason).
    Refuses(&'static str),
    /// It does not know the name and refuses the file.
    Unknown,
}

/// What the linked llama.cpp does with a file whose `general.architecture` is `name`.
pub fn llama_support(name: &str) -> LlamaSupport {
    if let Some((_, why)) = NOT_LOADABLE.iter().find(|(n, _)| *n == name) {
        return LlamaSupport::Refuses(why);
    }
    if LLAMA_ARCH_NAMES.contains(&name) {
        LlamaSupport::Loads
    } else {
        LlamaSupport::Unknown
    }
}

/// The architectures the linked llama.cpp loads as a model, in its table's order.
pub fn loadable_archs() -> impl Iterator<Item = &'static str> {
    LLAMA_ARCH_NAMES
        .into_iter()
        .filter(|n| llama_support(n) == LlamaSupport::Loads)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use super::*;

    /// The llama.cpp source of the pinned llama-cpp-sys-2 in cargo's registry (where the build
    /// unpacked it). Panics, failing the test, when it cannot be found: these tests compare with
    /// the source and never pass without reading it.
    pub(crate) fn vendored_llama_cpp() -> PathBuf {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("llama-cpp-sys-2 "))
            .unwrap_or_else(|| panic!("{}: no llama-cpp-sys-2 dependency", manifest.display()));
        let version = line
            .split('"')
            .nth(1)
            .map(|v| v.trim_start_matches('='))
            .unwrap_or_else(|| panic!("no version in '{line}'"));
        assert_eq!(
            version, LLAMA_CPP_SYS_VERSION,
            "the pin moved: review these lists"
        );
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .expect("neither CARGO_HOME nor HOME is set");
        let registry = cargo_home.join("registry/src");
        let mut found = Vec::new();
        for index in std::fs::read_dir(&registry)
            .unwrap_or_else(|e| panic!("{}: {e}", registry.display()))
            .flatten()
        {
            let dir = index
                .path()
                .join(format!("llama-cpp-sys-2-{version}/llama.cpp"));
            if dir.join("src/llama-arch.cpp").is_file() {
                found.push(dir);
            }
        }
        found.sort();
        found.pop().unwrap_or_else(|| {
            panic!(
                "llama-cpp-sys-2-{version}/llama.cpp/src/llama-arch.cpp not found under {}",
                registry.display()
            )
        })
    }

    pub(crate) fn read(root: &Path, file: &str) -> String {
        let path = root.join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The text from the line containing `start` to the first line after it that starts with
    /// `end`.
    pub(crate) fn block<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
        let from = text
            .find(start)
            .unwrap_or_else(|| panic!("'{start}' not in the source"));
        let rest = &text[from..];
        let to = rest
            .find(&format!("\n{end}"))
            .unwrap_or_else(|| panic!("no '{end}' after '{start}'"));
        &rest[..to]
    }

    /// `LLM_ARCH_NAMES`: enum suffix -> name, in the table's order, parsed line by line as
    /// `{ LLM_ARCH_<ENUM>, "<name>" },`.
    pub(crate) fn arch_table(arch_cpp: &str) -> Vec<(String, String)> {
        let table = block(arch_cpp, "LLM_ARCH_NAMES = {", "};");
        let mut out = Vec::new();
        for line in table.lines().skip(1) {
            let line = line.trim();
            let Some(rest) = line
                .strip_prefix("{ LLM_ARCH_")
                .or(line.strip_prefix("{LLM_ARCH_"))
            else {
                assert!(
                    line.is_empty() || line.starts_with("//"),
                    "unparsed line '{line}'"
                );
                continue;
            };
            let (enum_name, rest) = rest.split_once(',').expect("a comma after the enum");
            let name = rest.split('"').nth(1).expect("a quoted name");
            out.push((enum_name.trim().to_string(), name.to_string()));
        }
        out
    }

    /// The `case LLM_ARCH_<X>:` labels of the function starting at `start`.
    fn cases(text: &str, start: &str) -> BTreeSet<String> {
        block(text, start, "}")
            .lines()
            .filter_map(|l| l.trim().strip_prefix("case LLM_ARCH_"))
            .map(|l| l.trim_end_matches(':').trim().to_string())
            .collect()
    }

    #[test]
    fn the_list_is_llama_cpps_table() {
        let root = vendored_llama_cpp();
        let table = arch_table(&read(&root, "src/llama-arch.cpp"));
        let names: Vec<&str> = table.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, LLAMA_ARCH_NAMES.to_vec());
    }

    #[test]
    fn the_refused_names_are_those_llama_cpp_refuses() {
        let root = vendored_llama_cpp();
        let table: BTreeMap<String, String> = arch_table(&read(&root, "src/llama-arch.cpp"))
            .into_iter()
            .collect();
        let model_cpp = read(&root, "src/llama-model.cpp");
        let mapped = cases(&model_cpp, "static llama_model * llama_model_mapping(");
        // Without a case in llama_model_mapping: "unsupported model architecture".
        let mut refused: BTreeSet<&str> = table
            .iter()
            .filter(|(e, _)| !mapped.contains(*e))
            .map(|(_, n)| n.as_str())
            .collect();
        // CLIP has a class, but llama_model_load refuses it after reading its metadata.
        let llama_cpp = read(&root, "src/llama.cpp");
        assert!(llama_cpp.contains("if (model->arch == LLM_ARCH_CLIP) {"));
        assert!(llama_cpp.contains("CLIP cannot be used as main model"));
        refused.insert("clip");
        let ours: BTreeSet<&str> = LLAMA_ARCH_NAMES
            .into_iter()
            .filter(|n| matches!(llama_support(n), LlamaSupport::Refuses(_)))
            .collect();
        assert_eq!(ours, refused);
        assert_eq!(llama_support("no-such-arch"), LlamaSupport::Unknown);
        assert_eq!(llama_support("gemma3"), LlamaSupport::Loads);
        assert_eq!(loadable_archs().count(), LLAMA_ARCH_NAMES.len() - 3);
    }

    #[test]
    fn recurrent_and_hybrid_lists_are_llama_cpps() {
        let root = vendored_llama_cpp();
        let arch_cpp = read(&root, "src/llama-arch.cpp");
        let table: BTreeMap<String, String> = arch_table(&arch_cpp).into_iter().collect();
        let named = |start: &str| -> BTreeSet<String> {
            cases(&arch_cpp, start)
                .iter()
                .map(|e| {
                    table
                        .get(e)
                        .unwrap_or_else(|| panic!("LLM_ARCH_{e}"))
                        .clone()
                })
                .collect()
        };
        let ours = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(named("bool llm_arch_is_recurrent("), ours(&RECURRENT_ARCHS));
        assert_eq!(named("bool llm_arch_is_hybrid("), ours(&HYBRID_ARCHS));
    }
}
