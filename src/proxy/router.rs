//! Routing: the configured route that a request matches gives its `route` label and upstream.
//! The set of labels is fixed by the configuration (plus `other`), so it stays bounded.

use std::sync::Arc;

use crate::config::{Config, PathMatch, RouteConfig, Upstream};
use crate::format::{Format, ThinkSettings};

/// The route label of requests that match no configured route.
pub const OTHER_ROUTE: &str = "other";

/// A route resolved for one request.
#[derive(Debug, Clone)]
pub struct Route {
    /// The `route` label value.
    pub name: Arc<str>,
    /// Where the request goes.
    pub upstream: Arc<Upstream>,
    /// The streaming API configured for the route; `None` detects it per stream.
    pub format: Option<Format>,
    /// How the route's streams show thinking without a reasoning parser.
    pub think: ThinkSettings,
}

/// The routing table, built once from the configuration.
#[derive(Debug, Clone)]
pub struct Router {
    routes: Vec<(RouteConfig, Route)>,
    fallback: Route,
}

// === impl Router ===

impl Router {
    /// Builds the table from a validated configuration.
    pub fn new(config: &Config) -> Self {
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let route = Route {
                    name: Arc::from(r.name.as_str()),
                    upstream: Arc::new(r.upstream.clone()),
                    format: r.format,
                    think: r.think.clone(),
                };
                (r.clone(), route)
            })
            .collect();
        Router {
            routes,
            fallback: Route {
                name: Arc::from(OTHER_ROUTE),
                upstream: Arc::new(config.server.upstream.clone()),
                format: None,
                think: ThinkSettings::default(),
            },
        }
    }

    /// The first route that matches, or `other`.
    pub fn route(&self, method: &http::Method, path: &str) -> &Route {
        self.routes
            .iter()
            .find(|(config, _)| {
                config.method.as_ref().is_none_or(|m| m == method)
                    && match config.match_kind {
                        PathMatch::Exact => path == config.path,
                        PathMatch::Prefix => path.starts_with(&config.path),
                    }
            })
            .map(|(_, route)| route)
            .unwrap_or(&self.fallback)
    }

    /// Every route label the table can produce, `other` last.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.routes
            .iter()
            .map(|(_, r)| &*r.name)
            .chain(std::iter::once(&*self.fallback.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins_and_the_rest_is_other() {
        let config = Config::from_toml(
            r#"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
method = "POST"
[[routes]]
name = "v1"
path = "/v1/"
upstream = "http://127.0.0.1:9"
"#,
        )
        .unwrap();
        let router = Router::new(&config);
        let post = http::Method::POST;
        assert_eq!(&*router.route(&post, "/v1/chat/completions").name, "chat");
        assert_eq!(
            &*router
                .route(&http::Method::GET, "/v1/chat/completions")
                .name,
            "v1"
        );
        assert_eq!(&*router.route(&post, "/v1/chat/completions/x").name, "v1");
        assert_eq!(
            router
                .route(&post, "/v1/models")
                .upstream
                .authority
                .port_u16(),
            Some(9)
        );
        assert_eq!(&*router.route(&post, "/health").name, "other");
        assert_eq!(
            router.labels().collect::<Vec<_>>(),
            vec!["chat", "v1", "other"]
        );
    }
}
