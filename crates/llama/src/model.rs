//! A loaded llama.cpp model: one safe owner of `llama_model *`.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::backend::{log_tail, Backend};
use crate::error::LlamaError;

/// How to load a model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelParams {
    /// Split the layers across this machine's CPU and remote RPC servers.
    pub rpc: Option<crate::rpc::RpcSplit>,
    /// Layers to offload to a GPU (0 = CPU only; ignored without a GPU backend).
    pub gpu_layers: i32,
    /// Do not repack weights into the CPU backend's tiled layouts. Loading then reads nothing
    /// but the tensors a computation touches (the file is memory-mapped), which is what a census
    /// wants; the graph's nodes are the same, but matmul speed is not the native one.
    pub no_repack: bool,
}

/// A model loaded by llama.cpp. Freed on drop.
#[derive(Debug)]
pub struct Model {
    ptr: NonNull<sys::llama_model>,
    path: PathBuf,
}

// SAFETY: a llama_model is immutable after loading and llama.cpp allows using one model from
// several contexts on several threads.
unsafe impl Send for Model {}
// SAFETY: see above; no method mutates the model through &self.
unsafe impl Sync for Model {}

impl Model {
    /// Loads a GGUF file that passed opledger's gate: llama.cpp can abort on some malformed
    /// files instead of returning an error, so it is given nothing else.
    pub fn load(
        backend: &Backend,
        model: &opledger_gguf::LlamaLoadable,
        params: &ModelParams,
    ) -> Result<Model, LlamaError> {
        let path = model.path();
        let c_path =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| LlamaError::Load {
                path: path.to_path_buf(),
                why: "the path contains a NUL byte".into(),
            })?;
        // SAFETY: llama_model_default_params has no preconditions and returns a plain struct.
        let mut p = unsafe { sys::llama_model_default_params() };
        p.n_gpu_layers = params.gpu_layers;
        if params.no_repack {
            p.use_extra_bufts = false;
        }
        // the remote devices (null-terminated) and the layer split; kept alive across the load
        let mut devices: Vec<sys::ggml_backend_dev_t> = Vec::new();
        let mut split: Vec<f32> = Vec::new();
        if let Some(r) = &params.rpc {
            let (gpu_layers, s) = r.llama_split()?;
            crate::rpc::watch(r.timeout);
            devices = crate::rpc::remote_devices(backend, &r.servers, r.timeout)?
                .into_iter()
                .map(|d| d.0)
                .collect();
            devices.push(std::ptr::null_mut());
            // llama.cpp reads llama_max_devices() proportions (llama.h), whatever the devices
            // SAFETY: no preconditions; returns a constant.
            let max = unsafe { sys::llama_max_devices() };
            if s.len() > max {
                return Err(LlamaError::Invalid(format!(
                    "{} servers, but this llama.cpp splits over at most {max} devices",
                    s.len()
                )));
            }
            split = s;
            split.resize(max, 0.0);
            p.devices = devices.as_mut_ptr();
            p.n_gpu_layers = gpu_layers;
            p.split_mode = sys::LLAMA_SPLIT_MODE_LAYER;
            p.tensor_split = split.as_ptr();
            // loading uploads the weights to the servers: watched, progress marked as it goes
            p.progress_callback = Some(load_progress);
        }
        let watched = crate::rpc::Watched::new(params.rpc.is_some());
        // SAFETY: c_path is a valid NUL-terminated string that outlives the call; p is a valid
        // params struct obtained from llama.cpp's defaults; the backend token proves
        // llama_backend_init ran; devices and split outlive the call.
        let raw = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), p) };
        drop((watched, devices, split));
        let ptr = NonNull::new(raw).ok_or_else(|| LlamaError::Load {
            path: path.to_path_buf(),
            why: format!("llama.cpp refused the model ({})", log_tail(3)),
        })?;
        let model = Model {
            ptr,
            path: path.to_path_buf(),
        };
        if let Some(r) = &params.rpc {
            // llama.cpp places every block, the next-token-prediction ones (nextn) included
            // SAFETY: ptr is the model just loaded.
            let all = model.n_layer()
                + unsafe { sys::llama_model_n_layer_nextn(ptr.as_ptr()) }.max(0) as u32;
            let asked: u64 = r.layers.iter().map(|&l| l as u64).sum();
            if asked != all as u64 {
                return Err(LlamaError::Invalid(format!(
                    "the split places {asked} layers, the model has {all}"
                )));
            }
        }
        Ok(model)
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> u32 {
        // SAFETY: ptr is a valid model owned by self; the vocab pointer lives inside it and is
        // only read here.
        let n = unsafe { sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(self.ptr.as_ptr())) };
        n.max(0) as u32
    }

    pub fn n_layer(&self) -> u32 {
        // SAFETY: ptr is a valid model owned by self.
        unsafe { sys::llama_model_n_layer(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// Bytes of all weights as llama.cpp counts them.
    pub fn size_bytes(&self) -> u64 {
        // SAFETY: ptr is a valid model owned by self.
        unsafe { sys::llama_model_size(self.ptr.as_ptr()) }
    }

    /// llama.cpp's one-line description (`qwen35moe ?B Q4_K - Medium`).
    pub fn description(&self) -> String {
        let mut buf = [0 as c_char; 256];
        // SAFETY: ptr is a valid model; buf is writable for buf.len() bytes and llama.cpp writes a
        // NUL-terminated string of at most that length.
        let n = unsafe { sys::llama_model_desc(self.ptr.as_ptr(), buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return String::new();
        }
        c_chars_to_string(&buf)
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: ptr came from llama_model_load_from_file and is freed exactly once here; every
        // Context holds an Arc<Model>, so none outlives it.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// llama.cpp's load progress: marks progress for the watchdog of a split model, and goes on.
unsafe extern "C" fn load_progress(_progress: f32, _: *mut std::ffi::c_void) -> bool {
    crate::rpc::tick();
    true
}

/// A NUL-terminated C char buffer as a String (lossy), never reading past the buffer.
pub(crate) fn c_chars_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
