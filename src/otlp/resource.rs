//! The OTLP resource: who is reporting (`service.name`, `service.instance.id`, and the pod when
//! Kubernetes' downward API put it in the environment).

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// Environment variables the downward API is commonly given (first set wins), per attribute.
const K8S_ENV: &[(&str, &[&str])] = &[
    ("k8s.pod.name", &["K8S_POD_NAME", "POD_NAME"]),
    (
        "k8s.namespace.name",
        &["K8S_NAMESPACE_NAME", "POD_NAMESPACE"],
    ),
    ("k8s.node.name", &["K8S_NODE_NAME", "NODE_NAME"]),
    ("k8s.pod.uid", &["K8S_POD_UID", "POD_UID"]),
];

/// A string attribute.
pub fn string_kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..KeyValue::default()
    }
}

/// The resource attributes from `service_name` and the environment `env` reads: the
/// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` variables, the downward API's pod
/// variables, and the instance ID (the pod's name, else the host's, else the process ID).
pub fn attributes(service_name: &str, env: impl Fn(&str) -> Option<String>) -> Vec<KeyValue> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let mut attrs: Vec<(String, String)> = Vec::new();
    let mut put = |key: &str, value: String| match attrs.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => attrs.push((key.to_string(), value)),
    };
    put(
        "service.name",
        set("OTEL_SERVICE_NAME").unwrap_or_else(|| service_name.to_string()),
    );
    put("service.version", env!("CARGO_PKG_VERSION").to_string());
    let mut pod_name = None;
    for (key, names) in K8S_ENV {
        if let Some(value) = names.iter().find_map(|n| set(n)) {
            if *key == "k8s.pod.name" {
                pod_name = Some(value.clone());
            }
            put(key, value);
        }
    }
    let instance = pod_name
        .or_else(|| set("HOSTNAME"))
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    put("service.instance.id", instance);
    // OTEL_RESOURCE_ATTRIBUTES: `key=value,key=value`, percent-decoding left out (rare in
    // practice); it does not override service.name, which OTEL_SERVICE_NAME sets.
    if let Some(list) = set("OTEL_RESOURCE_ATTRIBUTES") {
        for pair in list.split(',') {
            if let Some((k, v)) = pair.split_once('=') {
                let k = k.trim();
                if !k.is_empty() && k != "service.name" {
                    put(k, v.trim().to_string());
                }
            }
        }
    }
    attrs.into_iter().map(|(k, v)| string_kv(&k, v)).collect()
}

/// The process's resource.
pub fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: attributes(service_name, |name| std::env::var(name).ok()),
        ..Resource::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_pairs(attrs: &[KeyValue]) -> Vec<(String, String)> {
        attrs
            .iter()
            .map(|kv| {
                let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("not a string: {other:?}"),
                };
                (kv.key.clone(), value)
            })
            .collect()
    }

    #[test]
    fn downward_api_variables_become_k8s_attributes() {
        let env = |name: &str| {
            match name {
                "POD_NAME" => Some("vllm-7f9c-abcde"),
                "POD_NAMESPACE" => Some("team-a"),
                "HOSTNAME" => Some("ignored-when-pod-name-is-set"),
                "OTEL_RESOURCE_ATTRIBUTES" => Some("deployment.environment=prod,service.name=x"),
                _ => None,
            }
            .map(String::from)
        };
        let pairs = as_pairs(&attributes("metronome", env));
        let get = |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.as_str());
        assert_eq!(get("service.name"), Some("metronome"));
        assert_eq!(get("k8s.pod.name"), Some("vllm-7f9c-abcde"));
        assert_eq!(get("k8s.namespace.name"), Some("team-a"));
        assert_eq!(get("service.instance.id"), Some("vllm-7f9c-abcde"));
        assert_eq!(get("deployment.environment"), Some("prod"));
        assert_eq!(get("k8s.node.name"), None);
    }

    #[test]
    fn without_kubernetes_the_host_is_the_instance() {
        let env = |name: &str| (name == "HOSTNAME").then(|| "box1".to_string());
        let pairs = as_pairs(&attributes("svc", env));
        assert!(pairs.contains(&("service.instance.id".into(), "box1".into())));
        assert!(pairs.contains(&("service.name".into(), "svc".into())));
        assert!(!pairs.iter().any(|p| p.0.starts_with("k8s.")));
    }
}
