//! The llama.cpp backend token (initialised once per process) and the capture of llama.cpp's log,
//! so that its messages reach our errors instead of flooding the terminal.

use std::collections::VecDeque;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, OnceLock};

use llama_cpp_sys_2 as sys;

/// The version of the vendored llama.cpp, as far as it can be known: the bindings crate carries
/// no git metadata, so its own version names the source.
pub const LLAMA_CPP_SYS_VERSION: &str = "llama-cpp-sys-2 0.1.161";

/// Lines of llama.cpp's log kept for error messages.
const LOG_LINES_KEPT: usize = 64;

static LOG: Mutex<LogState> = Mutex::new(LogState {
    lines: VecDeque::new(),
    partial: String::new(),
    echo: false,
});

struct LogState {
    lines: VecDeque<String>,
    partial: String,
    echo: bool,
}

/// Proof that llama.cpp's backend is initialised; every model load requires one.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    _private: (),
}

static INIT: OnceLock<()> = OnceLock::new();

impl Backend {
    /// Initialises llama.cpp once for the process and routes its log into a ring buffer.
    /// `echo_log` also prints it to stderr (for `--verbose`).
    pub fn init(echo_log: bool) -> Backend {
        if let Ok(mut log) = LOG.lock() {
            log.echo = echo_log;
        }
        INIT.get_or_init(|| {
            // SAFETY: llama_log_set stores a function pointer with a 'static lifetime and a null
            // user pointer; log_trampoline never unwinds. llama_backend_init has no
            // preconditions and runs once thanks to the OnceLock.
            unsafe {
                sys::llama_log_set(Some(log_trampoline), std::ptr::null_mut());
                sys::llama_backend_init();
            }
        });
        Backend { _private: () }
    }

    /// The last lines llama.cpp logged (warnings and errors first of all), newest last.
    pub fn recent_log(&self) -> Vec<String> {
        recent_log()
    }

    /// llama.cpp's own description of the CPU features it was built with.
    pub fn system_info(&self) -> String {
        // SAFETY: llama_print_system_info returns a pointer to a static, NUL-terminated buffer
        // owned by llama.cpp; we copy it before returning.
        unsafe {
            let p = sys::llama_print_system_info();
            if p.is_null() {
                return String::new();
            }
            CStr::from_ptr(p).to_string_lossy().trim().to_string()
        }
    }
}

impl Backend {
    /// ggml's registered backends (`CPU`, `RPC`, `CUDA`, ...), as a worker's hello lists them.
    pub fn backends(&self) -> Vec<String> {
        // SAFETY: the registry is initialised (a Backend exists); each registration and its
        // name live as long as the process.
        unsafe {
            (0..sys::ggml_backend_reg_count())
                .filter_map(|i| {
                    let reg = sys::ggml_backend_reg_get(i);
                    (!reg.is_null()).then(|| text(sys::ggml_backend_reg_name(reg)))
                })
                .collect()
        }
    }

    /// ggml's devices now, each as a manifest records it
    /// ([`opledger_core::engine::device_line`]; the type named as a worker names it: `cpu`,
    /// `gpu` or `other`).
    pub fn devices(&self) -> Vec<String> {
        // SAFETY: as above; a device's name and description are strings it owns, and the
        // memory query writes two integers we own.
        unsafe {
            (0..sys::ggml_backend_dev_count())
                .filter_map(|i| {
                    let dev = sys::ggml_backend_dev_get(i);
                    if dev.is_null() {
                        return None;
                    }
                    let kind = match sys::ggml_backend_dev_type(dev) {
                        sys::GGML_BACKEND_DEVICE_TYPE_CPU => "cpu",
                        sys::GGML_BACKEND_DEVICE_TYPE_GPU => "gpu",
                        _ => "other",
                    };
                    let (mut free, mut total) = (0usize, 0usize);
                    sys::ggml_backend_dev_memory(dev, &mut free, &mut total);
                    Some(opledger_core::engine::device_line(
                        &text(sys::ggml_backend_dev_name(dev)),
                        &text(sys::ggml_backend_dev_description(dev)),
                        kind,
                        total as u64,
                        free as u64,
                    ))
                })
                .collect()
        }
    }
}

/// A NUL-terminated string ggml owns, copied (empty for a null pointer).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that lives through the call.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// The last lines llama.cpp logged at warning level or above.
pub(crate) fn recent_log() -> Vec<String> {
    LOG.lock()
        .map(|l| l.lines.iter().cloned().collect())
        .unwrap_or_default()
}

/// The last few logged lines joined for an error message.
pub(crate) fn log_tail(n: usize) -> String {
    let lines = recent_log();
    let start = lines.len().saturating_sub(n);
    lines[start..].join(" | ")
}

unsafe extern "C" fn log_trampoline(
    level: sys::ggml_log_level,
    text: *const c_char,
    _: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        if text.is_null() {
            return;
        }
        // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
        let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        let Ok(mut log) = LOG.lock() else { return };
        if log.echo {
            eprint!("{s}");
        }
        // CONT continues the previous line; keep warnings and errors, and info lines that
        // explain failures (llama.cpp logs load errors at ERROR, context errors at ERROR/WARN).
        let keep = level == sys::GGML_LOG_LEVEL_WARN
            || level == sys::GGML_LOG_LEVEL_ERROR
            || level == sys::GGML_LOG_LEVEL_CONT;
        if !keep {
            return;
        }
        log.partial.push_str(&s);
        while let Some(pos) = log.partial.find('\n') {
            let line: String = log.partial.drain(..=pos).collect();
            let line = line.trim().to_string();
            if !line.is_empty() {
                if log.lines.len() == LOG_LINES_KEPT {
                    log.lines.pop_front();
                }
                log.lines.push_back(line);
            }
        }
    });
}
