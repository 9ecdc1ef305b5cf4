//! A GPU trace without a GPU: Kineto's shape written by hand (one CPU thread launching onto a
//! compute stream and a communication stream that overlap, a memcpy, a kernel launched outside
//! every module, one before the first step, one linked only by its External id, one only by its
//! `ac2g` flow), read with the built-in PyTorch rules, every figure computed by hand below.

use std::collections::BTreeMap;

use opledger_core::import_rules::ImportRules;
use opledger_core::trace::{read_chrome, TraceOptions, TraceSummary};
use regex::Regex;

/// Host (CPU thread pid 100 tid 100) and device (pid 0: stream 7 computes, stream 20
/// communicates) events, in the order Kineto writes them: the CPU's, then the device's, with
/// the flows after the events they start or end at. Times in µs.
///
/// Step 1 (100..300): the model 110..280 holds the embedding (its kernel linked by External id
/// only, and an H2D memcpy), the attention (a q projection, flash attention), an all-reduce on
/// the communication stream, the MLP (a linear, a SiLU whose launch carries no correlation:
/// linked by its flow); after the model, aten::fill_ outside every module. Step 2 (300..400):
/// the model, its MLP, a SiLU. Before step 1, a fill_ launched outside every step.
const TRACE: &str = include_str!("fixtures/kineto-gpu-by-hand.json");

fn read() -> (TraceSummary, ImportRules) {
    let rules = ImportRules::builtin("pytorch").unwrap().unwrap();
    let opts = TraceOptions {
        step: Regex::new(rules.text.step.as_deref().unwrap()).unwrap(),
        arg_keys: rules.arg_keys(),
        context: rules.context(),
    };
    let s = read_chrome(TRACE.as_bytes(), "hand.json", &opts).unwrap();
    (s, rules)
}

/// Per band, a step's host self time and device time (µs), by the rules.
fn bands(
    s: &TraceSummary,
    rules: &ImportRules,
    step: usize,
) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let (mut host, mut device) = (BTreeMap::new(), BTreeMap::new());
    for (k, key) in s.keys.iter().enumerate() {
        let band = rules.band_of(key).unwrap_or("unassigned").to_string();
        let st = &s.steps[step];
        if st.self_us[k] > 0.0 {
            *host.entry(band.clone()).or_insert(0.0) += st.self_us[k];
        }
        if st.device_us[k] > 0.0 {
            *device.entry(band).or_insert(0.0) += st.device_us[k];
        }
    }
    (host, device)
}

fn map(v: &[(&str, f64)]) -> BTreeMap<String, f64> {
    v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
}

fn close(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && (va - vb).abs() < 1e-9)
}

#[test]
fn host_time_by_band_is_each_spans_self_time_the_streams_taking_none_of_it() {
    let (s, rules) = read();
    assert_eq!(s.steps.len(), 2, "the GPU track's annotation is no step");
    assert_eq!(s.steps[0].wall_us, 200.0);
    assert_eq!(s.steps[1].wall_us, 100.0);
    // Step 1, self time = duration less direct children:
    //   ProfilerStep#1 200 - model 170 - fill_ 10 = 20                         other
    //   LlamaForCausalLM_0 170 - (18 + 65 + 3 + 55) = 29                        other
    //   Embedding_0 18 - 7 - 7 = 4; aten::embedding 7 - 4 = 3, its launch 4;
    //     aten::copy_ 7 - 4 = 3, cudaMemcpyAsync 4: 4 + 3 + 4 + 3 + 4 = 18      other
    //   cudaLaunchKernel of the fill_ after the model 4 (a runtime call)         other
    //     other: 20 + 29 + 18 + 4 = 71
    //   LlamaAttention_0 65 - 14 - 38 = 13; sdpa 38 - 36 = 2; flash 36 - 5 = 31;
    //     its launch 5: 13 + 2 + 31 + 5 = 51                                     attention
    //   Linear_0 14 - 12 = 2; aten::linear 12 - 10 = 2; aten::mm 10 - 5 = 5;
    //     launch 5: 2 + 2 + 5 + 5 = 14                                           projections
    //   c10d::allreduce_ 3 - 2 = 1; record_param_comms 2 - 1 = 1; launch 1: 3   network
    //   LlamaMLP_0 55 - 24 - 8 = 23; Linear_1 24 - 22 = 2; aten::linear 22 - 20
    //     = 2; aten::mm 20 - 5 = 15; launch 5; aten::silu 8 - 4 = 4; launch 4:
    //     23 + 2 + 2 + 15 + 5 + 4 + 4 = 55                                       dense_ffn
    //   aten::fill_ in the step outside every module 10 - 4 = 6                  unassigned
    //   sum 71 + 51 + 14 + 3 + 55 + 6 = 200 = the wall: the streams, running meanwhile,
    //   take nothing from the CPU thread (its time is the host's, theirs the device's)
    let (host, _) = bands(&s, &rules, 0);
    let want = map(&[
        ("other", 71.0),
        ("attention", 51.0),
        ("projections", 14.0),
        ("network", 3.0),
        ("dense_ffn", 55.0),
        ("unassigned", 6.0),
    ]);
    assert!(close(&host, &want), "{host:?}");
    assert_eq!(s.steps[0].concurrency(), 1.0);
    // Step 2: ProfilerStep#2 100 - 90 = 10, the model 90 - 20 = 70 (other: 80); LlamaMLP_0
    // 20 - 8 = 12, aten::silu 8 - 4 = 4, launch 4 (dense_ffn: 20)
    let (host, _) = bands(&s, &rules, 1);
    assert!(
        close(&host, &map(&[("other", 80.0), ("dense_ffn", 20.0)])),
        "{host:?}"
    );
}

#[test]
fn device_time_goes_to_the_band_of_the_launch_and_its_context() {
    let (s, rules) = read();
    // Step 1's device activity, each with its launch's band:
    //   indexSelectLargeIndex 10 (by External id 3: the launch under aten::embedding in
    //     Embedding_0) + Memcpy HtoD 4 (cudaMemcpyAsync under aten::copy_ in Embedding_0)  other 14
    //   gemm 30 (launch under aten::mm, aten::linear, Linear_0, LlamaAttention_0)   projections 30
    //   flash_fwd_kernel 50 (under the sdpa ops in LlamaAttention_0)                 attention 50
    //   ncclDevKernel_AllReduce 60 on stream 20 (under c10d::allreduce_)            network 60
    //   gemm 60 (Linear_1 in LlamaMLP_0) + silu_kernel 6 (no correlation: its flow 15
    //     from the launch under aten::silu in LlamaMLP_0)                          dense_ffn 66
    //   fill_kernel 4 at 300..304 (launched by aten::fill_ in step 1 outside every module;
    //     it runs in step 2's window but is step 1's)                            unassigned 4
    let (_, device) = bands(&s, &rules, 0);
    let want = map(&[
        ("other", 14.0),
        ("projections", 30.0),
        ("attention", 50.0),
        ("network", 60.0),
        ("dense_ffn", 66.0),
        ("unassigned", 4.0),
    ]);
    assert!(close(&device, &want), "{device:?}");
    let st = &s.steps[0];
    assert_eq!(st.kernels, 8);
    // activity sum 14 + 30 + 50 + 60 + 66 + 4 = 224; busy = the union over both streams:
    // 130..140 (10), 141..145 (4), 150..296 (146: stream 7's 150..180..230..290..296, and
    // stream 20's 210..270 inside it), 300..304 (4) = 164; concurrency 224 / 164
    assert_eq!(st.device_us.iter().sum::<f64>(), 224.0);
    assert_eq!(st.device_busy_us, 164.0);
    // the step's wall is 200 on the host; its last activity ends at 304: 204 from its start
    assert_eq!(st.device_end_us, Some(304.0));
    // step 2: silu_kernel 6, dense_ffn; busy 6
    let (_, device) = bands(&s, &rules, 1);
    assert!(close(&device, &map(&[("dense_ffn", 6.0)])), "{device:?}");
    assert_eq!(s.steps[1].kernels, 1);
    assert_eq!(s.steps[1].device_busy_us, 6.0);
    assert_eq!(s.steps[1].device_end_us, Some(326.0));
}

#[test]
fn activity_launched_outside_every_step_is_counted_not_dropped() {
    let (s, _) = read();
    // the fill_ before step 1: 5 µs; every other activity was linked
    assert_eq!(s.device.events, 10);
    assert_eq!(
        (s.device.outside_steps, s.device.outside_steps_us),
        (1, 5.0)
    );
    assert_eq!((s.device.unlinked, s.device.unlinked_us), (0, 0.0));
    assert_eq!((s.device.devices, s.device.streams), (1, 2));
    // the launch outside every step is a host span outside every step too
    assert_eq!(s.outside_steps, 2);
}

#[test]
fn a_kernel_without_any_link_is_counted_unlinked() {
    // the silu kernel's flow end removed: nothing links it any more
    let t = TRACE.replace(
        r#"{"ph":"f","cat":"ac2g","name":"ac2g","id":15,"pid":0,"tid":7,"ts":290,"bp":"e"},"#,
        "",
    );
    let rules = ImportRules::builtin("pytorch").unwrap().unwrap();
    let opts = TraceOptions {
        step: Regex::new(rules.text.step.as_deref().unwrap()).unwrap(),
        arg_keys: rules.arg_keys(),
        context: rules.context(),
    };
    let s = read_chrome(t.as_bytes(), "hand.json", &opts).unwrap();
    assert_eq!((s.device.unlinked, s.device.unlinked_us), (1, 6.0));
    assert_eq!(s.steps[0].device_us.iter().sum::<f64>(), 224.0 - 6.0);
}

#[test]
fn kernels_key_their_launch_and_its_context() {
    let (s, _) = read();
    let flash = s
        .keys
        .iter()
        .find(|k| k.name.contains("flash_fwd_kernel"))
        .unwrap();
    assert_eq!(flash.cat, "kernel");
    assert_eq!(flash.parent, "cudaLaunchKernel");
    assert_eq!(
        flash.within,
        [
            "nn.Module: LlamaForCausalLM_0",
            "nn.Module: LlamaAttention_0",
            "aten::scaled_dot_product_attention",
            "aten::_scaled_dot_product_flash_attention"
        ]
    );
    // no span's context holds a step (its number would make every step's keys distinct)
    assert!(s
        .keys
        .iter()
        .all(|k| k.within.iter().all(|w| !w.starts_with("ProfilerStep"))));
}
