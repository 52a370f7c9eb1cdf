//! The OpenAPI document (`ledger-svc/openapi.json`, served at `GET /openapi.json`) against
//! the router: the document lists exactly the routes of `ledger_svc::route_table::ROUTES`
//! (the table the router consults before any handler, so a route missing from the table
//! is never served), and every documented operation, sent to the real binary with the
//! document's own examples, answers one of its documented statuses with the documented
//! media type (never the router's 404 or 405).

mod common;

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::Value;

use common::TestDb;
use common::service::{Options, Service};
use ledger_svc::route_table::{OPENAPI_JSON, OPENAPI_ROUTE, ROUTES, Served};

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// (listener, METHOD, template, fault injection only).
type RouteKey = (&'static str, String, String, bool);

fn document() -> Value {
    serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
}

/// Every operation of the document: (path, method, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if let Some(operation) = item.get(method) {
                found.push((path.clone(), method.to_owned(), operation.clone()));
            }
        }
    }
    found
}

fn tags(operation: &Value) -> Vec<&str> {
    operation["tags"]
        .as_array()
        .map(|tags| tags.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn listeners(operation: &Value) -> Vec<&'static str> {
    let tags = tags(operation);
    ["public", "admin"]
        .into_iter()
        .filter(|listener| tags.contains(listener))
        .collect()
}

#[test]
fn the_document_lists_exactly_the_routes_the_router_serves() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented: BTreeSet<RouteKey> = BTreeSet::new();
    for (path, method, operation) in operations(&doc) {
        let on = listeners(&operation);
        assert!(!on.is_empty(), "{method} {path}: no listener tag");
        let fault = tags(&operation).contains(&"fault-injection");
        for listener in on {
            documented.insert((listener, method.to_uppercase(), path.clone(), fault));
        }
    }
    let mut routed: BTreeSet<RouteKey> = BTreeSet::new();
    for route in ROUTES {
        let on: &[&'static str] = match route.served {
            Served::Public => &["public"],
            Served::Admin => &["admin"],
            Served::Both => &["public", "admin"],
        };
        for listener in on {
            for method in route.methods() {
                routed.insert((
                    listener,
                    method.to_owned(),
                    route.template.to_owned(),
                    route.fault_injection,
                ));
            }
        }
    }
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty() && unrouted.is_empty(),
        "served but not in openapi.json: {undocumented:?}; in openapi.json but not served: \
         {unrouted:?}"
    );
}

/// The example of a parameter or media type.
fn example<'a>(value: &'a Value, what: &str) -> &'a Value {
    value
        .get("example")
        .unwrap_or_else(|| panic!("{what}: no example"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_answers_as_documented() {
    let db = TestDb::new("openapi_answers").await;
    frozen_balances::schema::install_and_seed(&db.client)
        .await
        .expect("spot schema");
    let service = Service::start(
        &db.url(),
        Options {
            faults: true,
            ..Options::default()
        },
    )
    .await;
    let doc = document();

    // Served on both listeners, byte for byte the committed document.
    for base in [&service.public, &service.admin] {
        let served = service
            .send(service.http.get(format!("{base}{OPENAPI_ROUTE}")))
            .await
            .expect("openapi request");
        assert_eq!(served.status, 200);
        assert_eq!(served.content_type(), "application/json");
        assert_eq!(served.raw, OPENAPI_JSON);
    }

    for (path, method, operation) in operations(&doc) {
        let mut concrete = path.clone();
        let mut headers = Vec::new();
        for parameter in operation["parameters"].as_array().into_iter().flatten() {
            let name = parameter["name"].as_str().expect("parameter name");
            let value = example(parameter, name).as_str().expect("string example");
            match parameter["in"].as_str() {
                Some("path") => concrete = concrete.replace(&format!("{{{name}}}"), value),
                Some("header") => headers.push((name.to_owned(), value.to_owned())),
                other => panic!("{method} {path}: parameter in {other:?}"),
            }
        }
        assert!(
            !concrete.contains('{'),
            "{path}: a path parameter lacks an example"
        );
        for listener in listeners(&operation) {
            let base = if listener == "public" {
                &service.public
            } else {
                &service.admin
            };
            let method_name = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut request = service
                .http
                .request(method_name, format!("{base}{concrete}"));
            for (name, value) in &headers {
                // One key per listener, so a both-listener operation is not a replay.
                let value = if name.eq_ignore_ascii_case("idempotency-key") {
                    format!("{value}-{listener}")
                } else {
                    value.clone()
                };
                request = request.header(name, value);
            }
            if let Some(content) = operation["requestBody"]["content"].as_object() {
                let (media, spec) = content.iter().next().expect("a media type");
                let body = match example(spec, &path) {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                request = request.header("content-type", media).body(body);
            }
            let reply = service.send(request).await.expect("request");
            let what = format!("{} {concrete} on {listener}", method.to_uppercase());
            let status = reply.status.to_string();
            let documented = &operation["responses"][&status];
            assert!(
                !documented.is_null(),
                "{what}: status {status} is not documented: {}",
                reply.raw
            );
            assert_ne!(
                reply.body["type"], "urn:ledger:problem:no-route",
                "{what}: the router does not serve it"
            );
            let documented = match documented.get("$ref").and_then(Value::as_str) {
                Some(reference) => {
                    let name = reference.rsplit('/').next().unwrap();
                    &doc["components"]["responses"][name]
                }
                None => documented,
            };
            if let Some(content) = documented["content"].as_object() {
                assert!(
                    content.contains_key(reply.content_type()),
                    "{what}: answered {} with {}, documented {:?}",
                    status,
                    reply.content_type(),
                    content.keys().collect::<Vec<_>>()
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_document_does_not_list_is_not_served() {
    let db = TestDb::new("openapi_unlisted").await;
    let service = Service::start(&db.url(), Options::default()).await;
    let cases = [
        (&service.public, "GET", "/nothing-here", 404),
        (&service.admin, "GET", "/accounts/acct-0001", 404),
        (&service.public, "POST", "/accounts/acct-0001/grants", 404),
        (&service.public, "POST", "/transfers", 404),
        // Without --enable-fault-injection the fault routes are not served.
        (&service.admin, "GET", "/faults", 404),
        (&service.public, "DELETE", OPENAPI_ROUTE, 405),
    ];
    for (base, method, path, expected) in cases {
        let reply = service
            .send(service.http.request(
                Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{base}{path}"),
            ))
            .await
            .expect("request");
        assert_eq!(reply.status, expected, "{method} {path}: {}", reply.raw);
        assert_eq!(reply.content_type(), "application/problem+json");
    }
}
