//! Which names and attributes a family is exported under (`metrics.names`): metronome's own,
//! the OpenTelemetry GenAI semantic conventions' (for the histograms that have a semconv
//! meaning; the rest under `metronome.`), or both.
//!
//! The semconv names, units, attributes and bucket advice follow
//! open-telemetry/semantic-conventions-genai, `docs/gen-ai/gen-ai-metrics.md` (status
//! Development). `OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` selects the renamed
//! per-chunk histograms (`gen_ai.client.inference.*` for `gen_ai.client.operation.*`).

use std::sync::Arc;

use crate::config::Config;
use crate::format::Format;
use crate::metrics::Names;

/// Bucket advice of `gen_ai.server.time_to_first_token`.
pub const TTFT_ADVICE: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Bucket advice of `gen_ai.server.time_per_output_token`.
pub const TPOT_ADVICE: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// Bucket advice of `gen_ai.server.request.duration` and the client per-chunk histograms.
pub const DURATION_ADVICE: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// One semconv histogram: which metronome family (and which of its series) it is read from.
struct Semconv {
    family: &'static str,
    /// Only the series whose `point` label is this.
    point: Option<&'static str>,
    released: &'static str,
    latest: &'static str,
    /// The UCUM unit.
    unit: &'static str,
    advice: &'static [f64],
}

const SEMCONV: &[Semconv] = &[
    Semconv {
        family: "metronome_time_to_first_token_seconds",
        point: Some("ingress"),
        released: "gen_ai.server.time_to_first_token",
        latest: "gen_ai.server.time_to_first_token",
        unit: "s",
        advice: TTFT_ADVICE,
    },
    Semconv {
        family: "metronome_time_per_output_token_seconds",
        point: None,
        released: "gen_ai.server.time_per_output_token",
        latest: "gen_ai.server.time_per_output_token",
        unit: "s",
        advice: TPOT_ADVICE,
    },
    Semconv {
        family: "metronome_request_duration_seconds",
        point: None,
        released: "gen_ai.server.request.duration",
        latest: "gen_ai.server.request.duration",
        unit: "s",
        advice: DURATION_ADVICE,
    },
    // The client's view is the stream as it leaves metronome for the client: egress.
    Semconv {
        family: "metronome_time_to_first_token_seconds",
        point: Some("egress"),
        released: "gen_ai.client.operation.time_to_first_chunk",
        latest: "gen_ai.client.inference.time_to_first_chunk",
        unit: "s",
        advice: DURATION_ADVICE,
    },
    Semconv {
        family: "metronome_inter_token_latency_seconds",
        point: Some("egress"),
        released: "gen_ai.client.operation.time_per_output_chunk",
        latest: "gen_ai.client.inference.time_per_output_chunk",
        unit: "s",
        advice: DURATION_ADVICE,
    },
    // Both token types in one histogram, told apart by `gen_ai.token.type`. The conventions
    // have no server-side token histogram, so the client's name is used, as the per-chunk
    // histograms do.
    Semconv {
        family: "metronome_request_tokens",
        point: None,
        released: "gen_ai.client.token.usage",
        latest: "gen_ai.client.token.usage",
        unit: "{token}",
        advice: &crate::metrics::TOKEN_COUNTS,
    },
];

/// What the semconv attributes of a route's series say: read from its configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteFacts {
    /// `gen_ai.operation.name`.
    pub operation: &'static str,
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `server.address`: the upstream's host.
    pub address: String,
    /// `server.port`: the upstream's port.
    pub port: i64,
}

/// Routes by `route` label, the default (`other`, `server.upstream`) last.
#[derive(Debug, Default)]
struct Routes {
    named: Vec<(String, RouteFacts)>,
    fallback: Option<RouteFacts>,
}

/// How the families are named on export.
#[derive(Debug, Clone, Default)]
pub struct Naming {
    names: Names,
    latest: bool,
    routes: Arc<Routes>,
}

/// An attribute value: semconv's `server.port` is an integer, everything else a string.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// One family as it is exported: its name, unit and which series and labels it carries.
#[derive(Debug, Clone)]
pub struct Renamed {
    /// The exported metric name.
    pub name: String,
    /// The UCUM unit (`s`, `{token}`, empty for a plain ratio or count).
    pub unit: &'static str,
    /// The classic bounds a Prometheus translation uses, when the semconv advises them.
    pub advice: Option<&'static [f64]>,
    point: Option<&'static str>,
    semconv: Option<Arc<Routes>>,
}

// === impl Naming ===

impl Naming {
    /// metronome's own names, as `/metrics` has them.
    pub fn metronome() -> Self {
        Naming::default()
    }

    /// The naming `config` asks for; `opt_in` is `OTEL_SEMCONV_STABILITY_OPT_IN`'s value.
    pub fn new(config: &Config, opt_in: Option<&str>) -> Self {
        let facts = |upstream: &crate::config::Upstream, format: Option<Format>, path: &str| {
            let (operation, provider) = semconv_of(format, path);
            let port = upstream.authority.port_u16().unwrap_or(
                if upstream.scheme == http::uri::Scheme::HTTPS {
                    443
                } else {
                    80
                },
            );
            RouteFacts {
                operation,
                provider,
                address: upstream.authority.host().to_string(),
                port: i64::from(port),
            }
        };
        let named = config
            .routes
            .iter()
            .map(|r| (r.name.clone(), facts(&r.upstream, r.format, &r.path)))
            .collect();
        Naming {
            names: config.metrics.names,
            latest: opt_in.is_some_and(|v| {
                v.split(',')
                    .any(|s| s.trim() == "gen_ai_latest_experimental")
            }),
            routes: Arc::new(Routes {
                named,
                fallback: Some(facts(&config.server.upstream, None, "")),
            }),
        }
    }

    /// The naming with `names` and the released or latest semconv names, routes unknown (for
    /// tests).
    pub fn with(names: Names, latest: bool) -> Self {
        Naming {
            names,
            latest,
            routes: Arc::default(),
        }
    }

    /// Which names are in use.
    pub fn names(&self) -> Names {
        self.names
    }

    /// The schema URL of the scope (empty: the GenAI conventions have no released schema yet).
    pub fn schema_url(&self) -> &str {
        ""
    }

    /// The semconv histograms read from `family`.
    pub fn semconv(&self, family: &str) -> Vec<Renamed> {
        SEMCONV
            .iter()
            .filter(|s| s.family == family)
            .map(|s| Renamed {
                name: if self.latest { s.latest } else { s.released }.to_string(),
                unit: s.unit,
                advice: Some(s.advice),
                point: s.point,
                semconv: Some(self.routes.clone()),
            })
            .collect()
    }

    /// The GenAI attributes of a series with `labels` (`route`, `model`), whatever the names:
    /// what a stream's span carries.
    pub fn genai_attributes(&self, labels: &[(String, String)]) -> Vec<(String, Value)> {
        Renamed {
            name: String::new(),
            unit: "",
            advice: None,
            point: None,
            semconv: Some(self.routes.clone()),
        }
        .attributes(labels)
    }

    /// The names a histogram family is exported under on OTLP.
    pub fn histogram(&self, family: &str) -> Vec<Renamed> {
        let semconv = self.semconv(family);
        match self.names {
            Names::Metronome => vec![Renamed::same(family)],
            Names::Both => std::iter::once(Renamed::same(family))
                .chain(semconv)
                .collect(),
            Names::Otel if semconv.is_empty() => vec![Renamed::namespaced(family)],
            Names::Otel => semconv,
        }
    }

    /// The names a counter or gauge family is exported under on OTLP.
    pub fn scalar(&self, family: &str) -> Vec<Renamed> {
        match self.names {
            Names::Otel => vec![Renamed::namespaced(family)],
            _ => vec![Renamed::same(family)],
        }
    }
}

/// `gen_ai.operation.name` and `gen_ai.provider.name` for a route's format (or, with `auto`,
/// its path).
pub fn semconv_of(format: Option<Format>, path: &str) -> (&'static str, &'static str) {
    let text_completion = path.ends_with("/completions") && !path.ends_with("/chat/completions");
    match format {
        Some(Format::Anthropic) => ("chat", "anthropic"),
        Some(Format::Gemini) => ("generate_content", "gcp.gemini"),
        Some(Format::Tgi) => ("text_completion", "tgi"),
        Some(Format::LlamaCpp) => ("text_completion", "llama.cpp"),
        Some(Format::SgLang) => ("text_completion", "sglang"),
        Some(Format::Ollama) => ("chat", "ollama"),
        Some(Format::Responses) => ("chat", "openai"),
        _ if text_completion => ("text_completion", "openai"),
        // OpenAI's chat API, which vLLM, SGLang and most servers speak.
        _ => ("chat", "openai"),
    }
}

// === impl Renamed ===

impl Renamed {
    /// The family under its own name, its unit read off the name's suffix.
    pub fn same(family: &str) -> Self {
        Renamed {
            name: family.to_string(),
            unit: unit_of(family),
            advice: None,
            point: None,
            semconv: None,
        }
    }

    /// A family without a semconv meaning under OpenTelemetry's style: `metronome.` and the
    /// name without its unit suffix (`metronome_stall_duration_seconds` is
    /// `metronome.stall_duration`, unit `s`).
    pub fn namespaced(family: &str) -> Self {
        let bare = family.strip_prefix("metronome_").unwrap_or(family);
        let bare = ["_seconds", "_total"]
            .iter()
            .find_map(|s| bare.strip_suffix(s))
            .unwrap_or(bare);
        Renamed {
            name: format!("metronome.{bare}"),
            ..Renamed::same(family)
        }
    }

    /// Whether a series with `labels` is exported under this name.
    pub fn keeps(&self, labels: &[(String, String)]) -> bool {
        self.point
            .is_none_or(|p| labels.iter().any(|(k, v)| k == "point" && v == p))
    }

    /// The attributes of a series with `labels`.
    pub fn attributes(&self, labels: &[(String, String)]) -> Vec<(String, Value)> {
        let Some(routes) = &self.semconv else {
            return labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::Str(v.clone())))
                .collect();
        };
        let label = |name: &str| {
            labels
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let route = label("route").unwrap_or("other");
        let facts = routes
            .named
            .iter()
            .find(|(name, _)| name == route)
            .map(|(_, f)| f)
            .or(routes.fallback.as_ref());
        let (operation, provider) =
            facts.map_or(semconv_of(None, ""), |f| (f.operation, f.provider));
        let mut out = vec![
            ("gen_ai.operation.name".into(), Value::Str(operation.into())),
            ("gen_ai.provider.name".into(), Value::Str(provider.into())),
        ];
        if let Some(model) = label("model") {
            // metronome reads the model from the response; the request names the same one
            // unless the server aliases it, so both attributes carry it.
            out.push(("gen_ai.request.model".into(), Value::Str(model.into())));
            out.push(("gen_ai.response.model".into(), Value::Str(model.into())));
        }
        if let Some(kind) = label("type") {
            out.push(("gen_ai.token.type".into(), Value::Str(kind.into())));
        }
        if let Some(f) = facts {
            out.push(("server.address".into(), Value::Str(f.address.clone())));
            out.push(("server.port".into(), Value::Int(f.port)));
        }
        // Two routes to one upstream stay two series, and so do the phases of one route's
        // gaps (the conventions have no phase; summed over it, the series is theirs).
        out.push(("metronome.route".into(), Value::Str(route.into())));
        if let Some(phase) = label("phase") {
            out.push(("metronome.phase".into(), Value::Str(phase.into())));
        }
        out
    }
}

/// The UCUM unit a Prometheus name's suffix says.
fn unit_of(name: &str) -> &'static str {
    if name.ends_with("_seconds") {
        "s"
    } else if name.ends_with("_tokens_total")
        || name.ends_with("tokens_per_event")
        || name.ends_with("_request_tokens")
    {
        "{token}"
    } else {
        ""
    }
}

/// The Prometheus name of an OpenTelemetry metric: dots to underscores, the unit's suffix
/// (`_seconds` for `s`) appended, as OpenTelemetry's Prometheus compatibility spells it.
pub fn prometheus_name(name: &str, unit: &str) -> String {
    let base = name.replace('.', "_");
    match unit {
        "s" if !base.ends_with("_seconds") => format!("{base}_seconds"),
        _ => base,
    }
}

/// The Prometheus label name of an attribute key.
pub fn prometheus_label(key: &str) -> String {
    key.replace('.', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otel_names_replace_the_semconv_histograms_and_namespace_the_rest() {
        let n = Naming::with(Names::Otel, false);
        let ttft: Vec<String> = n
            .histogram("metronome_time_to_first_token_seconds")
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(
            ttft,
            [
                "gen_ai.server.time_to_first_token",
                "gen_ai.client.operation.time_to_first_chunk"
            ]
        );
        let stall = &n.histogram("metronome_stall_duration_seconds")[0];
        assert_eq!(
            (stall.name.as_str(), stall.unit),
            ("metronome.stall_duration", "s")
        );
        assert_eq!(
            n.scalar("metronome_stalls_total")[0].name,
            "metronome.stalls"
        );
        let both = Naming::with(Names::Both, true);
        let itl: Vec<String> = both
            .histogram("metronome_inter_token_latency_seconds")
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(
            itl,
            [
                "metronome_inter_token_latency_seconds",
                "gen_ai.client.inference.time_per_output_chunk"
            ]
        );
    }

    #[test]
    fn semconv_series_are_chosen_by_point_and_carry_the_genai_attributes() {
        let n = Naming::with(Names::Otel, false);
        let r = &n.semconv("metronome_time_to_first_token_seconds")[0];
        let labels = |point: &str| {
            vec![
                ("route".to_string(), "chat".to_string()),
                ("model".to_string(), "m1".to_string()),
                ("point".to_string(), point.to_string()),
            ]
        };
        assert!(r.keeps(&labels("ingress")) && !r.keeps(&labels("egress")));
        let keys: Vec<String> = r
            .attributes(&labels("ingress"))
            .into_iter()
            .map(|a| a.0)
            .collect();
        assert_eq!(
            keys,
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "gen_ai.response.model",
                "metronome.route"
            ]
        );
        assert_eq!(
            prometheus_name("gen_ai.server.time_to_first_token", "s"),
            "gen_ai_server_time_to_first_token_seconds"
        );
        assert_eq!(
            prometheus_label("gen_ai.operation.name"),
            "gen_ai_operation_name"
        );
    }

    #[test]
    fn the_token_histogram_is_the_client_token_usage_with_its_token_type() {
        for latest in [false, true] {
            let n = Naming::with(Names::Otel, latest);
            let renamed = n.histogram("metronome_request_tokens");
            assert_eq!(renamed.len(), 1);
            let r = &renamed[0];
            assert_eq!(
                (r.name.as_str(), r.unit),
                ("gen_ai.client.token.usage", "{token}")
            );
            assert_eq!(r.advice, Some(&crate::metrics::TOKEN_COUNTS[..]));
            let labels = [
                ("route".to_string(), "chat".to_string()),
                ("model".to_string(), "m1".to_string()),
                ("type".to_string(), "input".to_string()),
            ];
            let attributes = r.attributes(&labels);
            assert!(attributes.contains(&("gen_ai.token.type".into(), Value::Str("input".into()))));
            assert!(!attributes.iter().any(|(k, _)| k == "type"));
            assert_eq!(
                prometheus_name(&r.name, r.unit),
                "gen_ai_client_token_usage"
            );
        }
        let own = &Naming::metronome().histogram("metronome_request_tokens")[0];
        assert_eq!(
            (own.name.as_str(), own.unit),
            ("metronome_request_tokens", "{token}")
        );
    }

    #[test]
    fn formats_map_to_semconv_operations_and_providers() {
        assert_eq!(semconv_of(None, "/v1/chat/completions"), ("chat", "openai"));
        assert_eq!(
            semconv_of(None, "/v1/completions"),
            ("text_completion", "openai")
        );
        assert_eq!(
            semconv_of(Some(Format::Anthropic), "/v1/messages"),
            ("chat", "anthropic")
        );
        assert_eq!(
            semconv_of(Some(Format::Gemini), "/x"),
            ("generate_content", "gcp.gemini")
        );
    }
}
