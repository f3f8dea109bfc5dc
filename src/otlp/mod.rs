//! OpenTelemetry export: metronome's metrics pushed as OTLP to a receiver.
//!
//! The export reads the families `/metrics` encodes, every `otlp.interval`, on the admin event
//! loop: the proxy's workers do nothing for it. With `traces = true` each stream's span is
//! decided at its end ([`traces`]) and sent by [`span_export`] from a bounded queue. The messages are the official OTLP protobufs
//! (`opentelemetry-proto`), sent as `http/protobuf` by [`transport`].

#[cfg(feature = "otlp")]
pub mod metrics;
pub mod names;
pub mod prometheus;
#[cfg(feature = "otlp")]
pub mod resource;
#[cfg(feature = "otlp")]
pub mod span_export;
pub mod traces;
#[cfg(feature = "otlp")]
pub mod transport;

#[cfg(feature = "otlp")]
pub use exporter::{spawn, ExportSources};

#[cfg(feature = "otlp")]
mod exporter {
    use std::sync::Arc;
    use std::time::{SystemTime, UNIX_EPOCH};

    use prometheus::{IntCounterVec, Opts};
    use prost014::Message;
    use tokio::sync::watch;
    use tokio::task::JoinHandle;

    use super::metrics::{request, Times};
    use super::names::Naming;
    use super::transport::{Signal, Transport};
    use crate::batch::BatchDetector;
    use crate::config::otlp::OtlpConfig;
    use crate::config::Config;
    use crate::metrics::Metrics;

    /// What the exporter reads: the configuration, the metric families, the span queue and the
    /// batch detector (for each span's episodes). Not the whole proxy state, so OTLP sits below
    /// the proxy that starts it.
    #[derive(Clone)]
    pub struct ExportSources {
        /// The configuration the proxy started with (`[otlp]`, `metrics.names`, the routes).
        pub config: Arc<Config>,
        /// The families `/metrics` encodes.
        pub metrics: Arc<Metrics>,
        /// The span queue, when `[otlp] traces = true`.
        pub spans: Option<Arc<super::traces::SpanSink>>,
        /// Batch-wide hitches, for the spans' episode events.
        pub batch: Arc<BatchDetector>,
    }

    fn unix_nanos() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// `metronome_otlp_exports_total{signal,result}`: exports by whether the receiver took them.
    fn exports_counter(state: &ExportSources) -> Option<IntCounterVec> {
        let counter = IntCounterVec::new(
            Opts::new(
                "metronome_otlp_exports_total",
                "OTLP exports by signal (metrics, traces) and result (ok, failed: the receiver was down, slow or refused; metrics are cumulative, so the next export carries what a failed one had).",
            ),
            &["signal", "result"],
        )
        .ok()?;
        for signal in ["metrics", "traces"] {
            for result in ["ok", "failed"] {
                counter.with_label_values(&[signal, result]);
            }
        }
        state.metrics.register(Box::new(counter.clone())).ok()?;
        Some(counter)
    }

    /// Starts the metrics exporter when `[otlp]` is configured: it exports every interval, and
    /// once more when `stop` turns true (so the last streams of a drain are not lost).
    pub fn spawn(state: ExportSources, stop: watch::Receiver<bool>) -> Option<JoinHandle<()>> {
        let config: OtlpConfig = state.config.otlp.clone()?;
        let tls = match crate::tls::client_config(None, None) {
            Ok(tls) => tls,
            Err(e) => {
                tracing::error!(error = %e, "OTLP export off: no TLS client configuration");
                return None;
            }
        };
        let exports = exports_counter(&state)?;
        let transport = Transport::new(&config, tls);
        let resource = super::resource::resource(&config.service_name);
        let naming = Naming::new(
            &state.config,
            std::env::var("OTEL_SEMCONV_STABILITY_OPT_IN")
                .ok()
                .as_deref(),
        );
        let traces = state.spans.as_ref().and_then(|sink| {
            Some(super::span_export::SpanExporter {
                receiver: sink.take_receiver()?,
                sink: sink.clone(),
                transport: transport.clone(),
                resource: resource.clone(),
                naming: naming.clone(),
                exports: exports.clone(),
                batch: state.batch.clone(),
                failing: false,
            })
        });
        let traces = traces.map(|exporter| tokio::spawn(exporter.run(stop.clone())));
        let metrics = tokio::spawn(async move {
            let start = unix_nanos();
            let mut stop = stop;
            let mut ticks = tokio::time::interval(config.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            let mut failing = false;
            loop {
                let last = tokio::select! {
                    _ = ticks.tick() => false,
                    _ = stop.wait_for(|s| *s) => true,
                };
                let times = Times {
                    start,
                    now: unix_nanos(),
                };
                let body = request(&state.metrics, &resource, &naming, times).encode_to_vec();
                match transport.send(Signal::Metrics, body).await {
                    Ok(()) => {
                        exports.with_label_values(&["metrics", "ok"]).inc();
                        if failing {
                            tracing::info!(endpoint = %config.endpoint, "OTLP metrics export works again");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        exports.with_label_values(&["metrics", "failed"]).inc();
                        if !failing {
                            tracing::warn!(endpoint = %config.endpoint, error = %e, "OTLP metrics export failed (counted in metronome_otlp_exports_total; logged again once it recovers)");
                        }
                        failing = true;
                    }
                }
                if last {
                    return;
                }
            }
        });
        Some(tokio::spawn(async move {
            let _ = metrics.await;
            if let Some(traces) = traces {
                let _ = traces.await;
            }
        }))
    }
}
