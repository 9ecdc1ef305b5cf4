//! The HTML reports opened in headless Chromium (Debian's `chromium`, installed by
//! `scripts/install-deps`): the page loads with no console message, its charts lay out as SVG
//! with drawn bars, the checks carry their colours, and a screenshot shows the chart's colours.
//! The screenshots stay in the test's temporary folder; copies go to /tmp for a reviewer:
//! opledger-report-screenshot.png (the profile) and opledger-report-screenshot-<kind>.png.

mod fixture;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opledger_report::{
    render, AbView, Format, ProfileView, RenderOptions, RunView, SweepView, WasteView,
};

/// How the environment expects Chromium to start (without the background-networking flags it
/// hangs on a closed network).
const FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
];

fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("OPLEDGER_CHROMIUM") {
        return PathBuf::from(p);
    }
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("chromium is not installed: run scripts/install-deps (Debian package `chromium`)");
}

/// Runs Chromium on `page` with `extra` flags and a fresh profile folder; returns (stdout,
/// stderr). Killed after two minutes.
fn run_chromium(work: &Path, tag: &str, extra: &[String], page: &Path) -> (String, String) {
    let profile = tempfile::tempdir_in(work).unwrap();
    let out_path = work.join(format!("{tag}.stdout"));
    let err_path = work.join(format!("{tag}.stderr"));
    let mut child = Command::new(chromium())
        .args(FLAGS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("starting chromium");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let stdout = std::fs::read_to_string(&out_path).unwrap();
            let stderr = std::fs::read_to_string(&err_path).unwrap();
            assert!(status.success(), "chromium {tag}: {status}\n{stderr}");
            return (stdout, stderr);
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium {tag} ran for two minutes\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes `html` as `<name>.html` in `work` and lays a copy carrying [`PROBE`] out in Chromium:
/// the page's path, the DOM Chromium dumped and the probe's measures. Fails on any console
/// message of the page.
fn laid_out(work: &Path, name: &str, html: &str) -> (std::path::PathBuf, String, Probe) {
    let page = work.join(format!("{name}.html"));
    std::fs::write(&page, html).unwrap();
    let probed = work.join(format!("{name}-probe.html"));
    std::fs::write(
        &probed,
        html.replace("</body>", &format!("{PROBE}\n</body>")),
    )
    .unwrap();
    let (dom, stderr) = run_chromium(
        work,
        &format!("{name}-dom"),
        &[
            "--enable-logging=stderr".into(),
            "--v=0".into(),
            "--dump-dom".into(),
        ],
        &probed,
    );
    assert!(
        console_lines(&stderr).is_empty(),
        "{name}: console messages:\n{}",
        console_lines(&stderr).join("\n")
    );
    let p = probe(&dom);
    (page, dom, p)
}

/// Console messages of the page in Chromium's log (`...:INFO:CONSOLE(3)] "Uncaught ..."`).
fn console_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .collect()
}

/// Measures the laid-out page from inside: per SVG its size, bars, drawn bars and shapes; per
/// check its class and the computed colour of its border. Written into the DOM for --dump-dom.
const PROBE: &str = r#"<script>
(function () {
  var svgs = [];
  document.querySelectorAll('svg').forEach(function (s) {
    var r = s.getBoundingClientRect();
    var bars = s.querySelectorAll('rect.bar');
    var drawn = 0;
    bars.forEach(function (b) { if (b.getBBox().width > 0) drawn++; });
    var shapes = s.querySelectorAll('rect,path,line,circle,polyline,polygon,text').length;
    svgs.push([Math.round(r.width), Math.round(r.height), bars.length, drawn, shapes].join(','));
  });
  var checks = [];
  document.querySelectorAll('ul.checks li').forEach(function (li) {
    checks.push(li.className + '=' + getComputedStyle(li).borderLeftColor);
  });
  var p = document.createElement('pre');
  p.id = 'probe';
  p.textContent = 'SVGS ' + svgs.join(';') + '\nCHECKS ' + checks.join(';') + '\nEND';
  document.body.appendChild(p);
})();
</script>"#;

struct Probe {
    /// (width, height, bars, drawn bars, shapes) per SVG.
    svgs: Vec<[u64; 5]>,
    /// (class, computed border colour) per check.
    checks: Vec<(String, String)>,
}

fn probe(dom: &str) -> Probe {
    // the script's own text holds the same words: read the element it wrote
    let at = dom
        .find("<pre id=\"probe\">")
        .expect("the probe ran and wrote into the DOM");
    let start = at + dom[at..].find("SVGS ").unwrap();
    let text = &dom[start..start + dom[start..].find("\nEND").unwrap()];
    let mut lines = text.lines();
    let svgs = lines
        .next()
        .unwrap()
        .trim_start_matches("SVGS ")
        .split(';')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let v: Vec<u64> = s.split(',').map(|x| x.parse().unwrap()).collect();
            [v[0], v[1], v[2], v[3], v[4]]
        })
        .collect();
    let checks = lines
        .next()
        .unwrap()
        .trim_start_matches("CHECKS ")
        .split(';')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (c, colour) = s.split_once('=').unwrap();
            (c.to_string(), colour.to_string())
        })
        .collect();
    Probe { svgs, checks }
}

/// Pixels of the PNG within 3 of `rgb` in every channel.
fn pixels_like(png_path: &Path, rgb: [u8; 3]) -> (usize, u32, u32) {
    let decoder = png::Decoder::new(std::io::BufReader::new(File::open(png_path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "a colour screenshot");
    let bytes = &buf[..info.buffer_size()];
    let count = bytes
        .chunks_exact(channels)
        .filter(|p| (0..3).all(|i| p[i].abs_diff(rgb[i]) <= 3))
        .count();
    (count, info.width, info.height)
}

fn hex(c: &str) -> [u8; 3] {
    let v = u32::from_str_radix(c.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
fn html_reports_render_in_chromium_without_console_errors() {
    let work = tempfile::tempdir().unwrap();
    let (cfg, graph, records, passes) = fixture::sweep_data();
    let (mp, rp) = (fixture::manifest("profile"), fixture::profile_raw());
    let ms = fixture::manifest("sweep");
    let (ma, ra) = (fixture::manifest("ab"), fixture::ab_report());
    let (mw, rw) = (fixture::manifest("waste"), fixture::profile_raw());
    let views = [
        RunView::Profile(ProfileView::new(&mp, &rp).unwrap()),
        RunView::Sweep(SweepView::new(&ms, &cfg, &graph, None, &records, &passes).unwrap()),
        RunView::Ab(AbView {
            manifest: &ma,
            report: &ra,
        }),
        RunView::Waste(WasteView::new(&mw, &rw, Some(fixture::WASTE_SOURCE.into())).unwrap()),
    ];
    for view in &views {
        let kind = view.kind();
        let html =
            String::from_utf8(render(view, Format::Html, &RenderOptions::default()).unwrap())
                .unwrap();
        // self-contained: nothing to fetch, no script
        for needle in ["<script", "src=", "href=", "@import", "url(", "https://"] {
            assert!(!html.contains(needle), "{kind}: the report holds {needle}");
        }
        assert!(
            !html
                .replace("http://www.w3.org/2000/svg", "")
                .contains("http://"),
            "{kind}: the report links out"
        );
        // the page as Chromium lays it out
        let (page, _, p) = laid_out(work.path(), kind, &html);
        assert!(!p.svgs.is_empty(), "{kind}: no SVG in the page");
        for s in &p.svgs {
            assert!(
                s[0] > 300 && s[1] > 150,
                "{kind}: an SVG laid out at {}x{}",
                s[0],
                s[1]
            );
            assert!(s[4] > 20, "{kind}: an SVG with {} shapes", s[4]);
        }
        if kind != "sweep" {
            // the bar charts: every band drew a bar (the fixture's bands all take time)
            let [_, _, bars, drawn, _] = p.svgs[0];
            assert!(
                bars >= 5 && drawn >= 5,
                "{kind}: {drawn} of {bars} bars drawn"
            );
        }
        assert!(!p.checks.is_empty(), "{kind}: no checks shown");
        for (class, colour) in &p.checks {
            let expected = match class.as_str() {
                "pass" => "rgb(26, 127, 55)",
                "warn" => "rgb(154, 103, 0)",
                "fail" => "rgb(207, 34, 46)",
                other => panic!("{kind}: a check of class {other}"),
            };
            assert_eq!(colour, expected, "{kind}: a {class} check's colour");
        }

        // the screenshot
        let shot = work.path().join(format!("{kind}.png"));
        let (_, stderr) = run_chromium(
            work.path(),
            &format!("{kind}-shot"),
            &[
                format!("--screenshot={}", shot.display()),
                "--window-size=1280,2000".into(),
            ],
            &page,
        );
        assert!(shot.is_file(), "{kind}: no screenshot\n{stderr}");
        let colour = match kind {
            "profile" => opledger_report::svg::band_colour("moe"),
            "sweep" => opledger_report::svg::band_colour("linear_attention"),
            "ab" => "#e4572e".to_string(),
            _ => "#c0392b".to_string(),
        };
        let (n, w, h) = pixels_like(&shot, hex(&colour));
        assert_eq!((w, h), (1280, 2000), "{kind}: screenshot size");
        assert!(
            n > 100,
            "{kind}: only {n} pixels of the chart colour {colour} on the screenshot"
        );
        let (passed, _, _) = pixels_like(&shot, hex("#dafbe1"));
        assert!(
            passed > 1000,
            "{kind}: the passed checks' green is missing ({passed} px)"
        );
        // for a reviewer: the profile's at the agreed place, the others beside it
        let keep = if kind == "profile" {
            "/tmp/opledger-report-screenshot.png".to_string()
        } else {
            format!("/tmp/opledger-report-screenshot-{kind}.png")
        };
        std::fs::copy(&shot, &keep).unwrap();
    }

    // the harness sees console errors: a page that throws is caught
    let broken = work.path().join("broken.html");
    std::fs::write(
        &broken,
        "<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>",
    )
    .unwrap();
    let (_, stderr) = run_chromium(
        work.path(),
        "broken",
        &[
            "--enable-logging=stderr".into(),
            "--v=0".into(),
            "--dump-dom".into(),
        ],
        &broken,
    );
    assert!(
        console_lines(&stderr)
            .iter()
            .any(|l| l.contains("Uncaught")),
        "a page that throws left no console line:\n{stderr}"
    );
}

/// A spread over two steps, from the two values.
fn two(a: f64, b: f64) -> opledger_core::stats::Spread {
    opledger_core::stats::Spread {
        median: (a + b) / 2.0,
        min: a.min(b),
        max: a.max(b),
        n: 2,
    }
}

/// The device ledger of crates/core/tests/fixtures/kineto-gpu-by-hand.json at one token a step,
/// from the figures computed by hand in crates/core/tests/kineto_gpu.rs (µs of step 1 and step
/// 2, host self time then device time; / 1000 for ms/token).
fn hand_device() -> opledger_core::device::DeviceStats {
    let band = |name: &str, host: [f64; 2], device: [f64; 2]| opledger_core::device::DeviceBand {
        band: name.into(),
        host_ms_per_token: two(host[0] / 1e3, host[1] / 1e3),
        device_ms_per_token: two(device[0] / 1e3, device[1] / 1e3),
        device_ms_per_token_steps: vec![device[0] / 1e3, device[1] / 1e3],
    };
    opledger_core::device::DeviceStats {
        activities: 9,
        devices: 1,
        streams: 2,
        bands: vec![
            band("attention", [51.0, 0.0], [50.0, 0.0]),
            band("projections", [14.0, 0.0], [30.0, 0.0]),
            band("dense_ffn", [55.0, 20.0], [66.0, 6.0]),
            band("network", [3.0, 0.0], [60.0, 0.0]),
            band("other", [71.0, 80.0], [14.0, 0.0]),
            band("unassigned", [6.0, 0.0], [4.0, 0.0]),
        ],
        step_wall_ms: two(0.2, 0.1),
        step_wall_with_device_ms: two(0.204, 0.1),
        busy_ms: two(0.164, 0.006),
        activity_ms: two(0.224, 0.006),
        stream_concurrency: Some(two(224.0 / 164.0, 1.0)),
        outside_steps: 1,
        outside_steps_ms: 0.005,
        unlinked: 0,
        unlinked_ms: 0.0,
        links_dropped: 0,
        unassigned: vec![("fill_kernel".into(), "cudaLaunchKernel".into(), 0.002)],
    }
}

/// An imported GPU trace's page: the chart "Where the time goes" draws a host bar and a device
/// bar for each of its six bands, both colours show on the screenshot, and the device section
/// states the busy time against the activity and the stream concurrency. The screenshot is
/// copied to /tmp/opledger-report-screenshot-device.png for a reviewer.
#[test]
fn an_imported_gpu_trace_shows_both_clocks_in_chromium() {
    let work = tempfile::tempdir().unwrap();
    let (mp, rp) = (fixture::manifest("profile"), fixture::profile_raw());
    let view = RunView::Profile(
        ProfileView::new(&mp, &rp)
            .unwrap()
            .with_device(Some(hand_device())),
    );
    let html =
        String::from_utf8(render(&view, Format::Html, &RenderOptions::default()).unwrap()).unwrap();
    let (page, dom, p) = laid_out(work.path(), "device", &html);
    // the first SVG is "Where the time goes": 6 bands x (host, device), every bar drawn (each
    // median is above 0: the smallest, network's host 0.0015 ms)
    let [w, h, bars, drawn, _] = p.svgs[0];
    assert!(w > 300 && h > 150, "the chart laid out at {w}x{h}");
    assert_eq!((bars, drawn), (12, 12), "bars of the chart, drawn");
    // the figures as Chromium shows them (hand-computed: busy (164 + 6) / 2 µs, activity
    // (224 + 6) / 2, concurrency (224 / 164 + 1) / 2)
    for needle in [
        "host 0.0255 · device 0.0250 ms",
        "host 0.0755 · device 0.0070 ms",
        "device busy 0.0850 [0.0060–0.1640] ms a step",
        "against 0.1150 [0.0060–0.2240] ms of activity: stream concurrency 1.1829 [1.0000–1.3659]",
        "streams: 2 on 1 device(s)",
    ] {
        assert!(dom.contains(needle), "the page lacks '{needle}'");
    }
    let shot = work.path().join("device.png");
    let (_, stderr) = run_chromium(
        work.path(),
        "device-shot",
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,1200".into(),
        ],
        &page,
    );
    assert!(shot.is_file(), "no screenshot\n{stderr}");
    for (clock, colour) in [
        ("host", opledger_report::palette::HOST_CLOCK),
        ("device", opledger_report::palette::DEVICE_CLOCK),
    ] {
        let (n, _, _) = pixels_like(&shot, hex(colour));
        assert!(
            n > 500,
            "only {n} pixels of the {clock} bars' colour {colour} on the screenshot"
        );
    }
    std::fs::copy(&shot, "/tmp/opledger-report-screenshot-device.png").unwrap();
}
