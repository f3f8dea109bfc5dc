//! `metronome demo`: the sim, the proxy in front of it and the probe through the proxy, all in
//! one process on loopback ports it picks; then the probe's report beside the proxy's own view.
//! The README's first command, and the quickest way to see what metronome measures.

use std::process::ExitCode;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::{Config, PathMatch, RouteConfig, Upstream};
use crate::metrics::Metrics;
use crate::probe::{self, Load, ProbeConfig, Stop};
use crate::proxy::ProxyHandle;
use crate::sim::{self, SimConfig};
use crate::units::format_duration;

/// 127.0.0.1 on a port the system picks.
const LOOPBACK_ANY_PORT: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Arguments of `metronome demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Streams the probe runs through the proxy.
    #[arg(long, default_value_t = 24)]
    pub streams: u64,
    /// Streams in flight at once (the sim slows down as this grows: continuous batching).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Output tokens per stream.
    #[arg(long, default_value_t = 48)]
    pub max_tokens: u32,
    /// Seed of the sim's cadence, so a run repeats.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Leave the sim and the proxy running after the report, until Ctrl-C.
    #[arg(long)]
    pub keep: bool,
}

/// Entry point of `metronome demo`.
pub async fn run(args: DemoArgs) -> ExitCode {
    match demo(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: the demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A loopback port could not be bound.
    #[error("cannot listen on loopback: {0}")]
    Bind(#[from] std::io::Error),
    /// The probe could not be set up or run.
    #[error("the probe failed: {0}")]
    Probe(String),
    /// The sim's configuration was refused.
    #[error("the sim's configuration is invalid: {0}")]
    Sim(String),
}

async fn demo(args: &DemoArgs) -> Result<(), DemoError> {
    // A reasoning model: each stream thinks (8 reasoning tokens and a 100 ms pause) before it
    // answers, so the first report shows TTFT (the first thought) beside TTFO (the answer).
    let sim_config = SimConfig {
        seed: args.seed,
        reasoning_tokens: 8,
        think_pause: Duration::from_millis(100),
        ..SimConfig::demo_contention()
    };
    sim_config
        .validate()
        .map_err(|e| DemoError::Sim(e.to_string()))?;
    let sim_description = format!(
        "a reasoning model ({} reasoning tokens, a {} think pause), jittered {} gaps, +{} per stream in flight, {:.0}% stalls of {}",
        sim_config.reasoning_tokens,
        format_duration(sim_config.think_pause),
        format_duration(sim_config.gap),
        format_duration(sim_config.contention_k),
        sim_config.stall_prob * 100.0,
        format_duration(sim_config.stall),
    );
    let sim = sim::spawn(TcpListener::bind("127.0.0.1:0").await?, sim_config)?;

    let mut config = Config::default();
    config.server.listen = LOOPBACK_ANY_PORT;
    config.server.admin = LOOPBACK_ANY_PORT;
    config.server.drain_grace = Duration::from_secs(2);
    config.server.upstream = Upstream::parse(&sim.url()).map_err(DemoError::Sim)?;
    config.routes = vec![RouteConfig {
        name: "chat".into(),
        path: "/v1/chat/completions".into(),
        match_kind: PathMatch::Exact,
        method: None,
        upstream: config.server.upstream.clone(),
        format: None,
        think: Default::default(),
    }];
    let proxy = ProxyHandle::start(config).await?;
    let proxy_url = format!("http://{}", proxy.proxy_addr);
    let metrics_url = format!("http://{}/metrics", proxy.admin_addr);

    println!("metronome demo: probe -> metronome -> sim, all on loopback\n");
    println!("  sim      {}  ({sim_description})", sim.url());
    println!("  proxy    {proxy_url}");
    println!("  metrics  {metrics_url}\n");

    let mut probe_config =
        ProbeConfig::new(&format!("{proxy_url}/v1/chat/completions"), "sim-model")
            .map_err(|e| DemoError::Probe(e.to_string()))?;
    probe_config.load = Load::Closed {
        concurrency: args.concurrency.max(1),
    };
    probe_config.stop = Stop::Requests(args.streams.max(1));
    probe_config.body = probe::args::chat_body(
        "sim-model",
        "Write a short story about a metronome.",
        args.max_tokens,
    );
    println!(
        "probing: {} streams of {} tokens, {} at a time ...\n",
        args.streams, args.max_tokens, args.concurrency
    );
    let run = probe::measure(&probe_config)
        .await
        .map_err(|e| DemoError::Probe(e.to_string()))?;
    let report = probe::summarize(&run, probe_config.stall_threshold);
    println!("What the client saw (probe):");
    print!("{}", probe::render_text(&report));

    // Streams are recorded when their last bytes reach the socket; give the last ones a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("\nWhat metronome saw (its own histograms, as Prometheus would read them):");
    print!("{}", proxy_view(&proxy.state.metrics));

    if args.keep {
        println!("\nStill running. Try:");
        println!(
            "  curl -N {proxy_url}/v1/chat/completions -d '{{\"model\":\"sim-model\",\"stream\":true,\"max_tokens\":20}}'"
        );
        println!("  curl -s {metrics_url} | grep metronome_inter_token_latency");
        println!("Ctrl-C stops.");
        crate::proxy::serve::wait_for_termination().await;
    } else {
        println!(
            "\n(`metronome demo --keep` leaves the sim and proxy running to curl and scrape.)"
        );
    }
    proxy.shutdown().await;
    let _ = sim.shutdown().await;
    Ok(())
}

/// The proxy's view: ingress against egress, from its registry.
pub fn proxy_view(metrics: &Metrics) -> String {
    let ms = |v: Option<f64>| match v {
        Some(v) => format!("{:.1}ms", v * 1e3),
        None => "-".into(),
    };
    let us = |v: Option<f64>| match v {
        Some(v) => format!("{:.0}us", v * 1e6),
        None => "-".into(),
    };
    // Label positions: route 0, model 1, point 2.
    let at = |point: &'static str| [(2usize, point)];
    // The native buckets (2^(1/16) apart) when the families keep them, as histogram_quantile
    // reads a native histogram; the classic buckets' linear interpolation otherwise.
    let native = metrics.itl.native().is_some();
    let quantile = |family: &crate::metrics::HistogramFamily, q: f64, filter: &[(usize, &str)]| {
        if native {
            family.native_quantile(q, filter)
        } else {
            family.quantile(q, filter)
        }
    };
    let stalls = |point: &str| -> u64 {
        crate::format::Phase::ALL
            .iter()
            .filter_map(|phase| {
                metrics
                    .stalls
                    .get_metric_with_label_values(&["chat", "sim-model", point, phase.as_str()])
                    .ok()
            })
            .map(|c| c.get())
            .sum()
    };
    let mut out = String::new();
    out += &format!("  {:<22}{:>12}{:>12}\n", "", "ingress", "egress");
    for (name, q) in [("ITL p50", 0.50), ("ITL p99", 0.99)] {
        out += &format!(
            "  {:<22}{:>12}{:>12}\n",
            name,
            ms(quantile(&metrics.itl, q, &at("ingress"))),
            ms(quantile(&metrics.itl, q, &at("egress")))
        );
    }
    out += &format!(
        "  {:<22}{:>12}{:>12}\n",
        "TTFT p50",
        ms(quantile(&metrics.ttft, 0.5, &at("ingress"))),
        ms(quantile(&metrics.ttft, 0.5, &at("egress")))
    );
    out += &format!(
        "  {:<22}{:>12}{:>12}\n",
        "TTFO p50",
        ms(quantile(&metrics.ttfo, 0.5, &at("ingress"))),
        ms(quantile(&metrics.ttfo, 0.5, &at("egress")))
    );
    out += &format!(
        "  {:<22}{:>12}{:>12}\n",
        "stalls (> threshold)",
        stalls("ingress"),
        stalls("egress")
    );
    out += &format!(
        "  {:<22}{:>12}\n",
        "proxy delay p50",
        us(quantile(&metrics.proxy_delay, 0.5, &[]))
    );
    out += &format!(
        "  {:<22}{:>12}\n",
        "proxy delay p99",
        us(quantile(&metrics.proxy_delay, 0.99, &[]))
    );
    // Summed over every finish reason (and route and model): the demo's streams all complete.
    let complete: f64 = prometheus::core::Collector::collect(&metrics.streams)
        .iter()
        .flat_map(|family| family.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "outcome" && l.value() == "complete")
        })
        .map(|m| m.get_counter().get_value())
        .sum();
    out += &format!("  {:<22}{:>12}\n", "streams complete", complete);
    out += if native {
        "  (quantiles from the native histograms, as histogram_quantile reads them: within about 2 %)\n"
    } else {
        "  (quantiles estimated from the classic buckets, as histogram_quantile does)\n"
    };
    out
}
