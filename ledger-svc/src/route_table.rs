//! Every route `ledger-svc` serves, as data: the HTTP router (`http::routes::route`)
//! first looks a request up here and answers 404 or 405 itself for anything not listed,
//! so a handler added to the router without a line here is never reached. The OpenAPI
//! document ([`OPENAPI_JSON`], committed as `ledger-svc/openapi.json`, served at
//! [`OPENAPI_ROUTE`]) must describe exactly these routes; `tests/openapi_contract.rs`
//! compares the two and sends every documented operation to a running service.

/// The OpenAPI 3.1 document of both listeners, as committed in `ledger-svc/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

/// Where both listeners serve [`OPENAPI_JSON`] (`GET`, `application/json`).
pub const OPENAPI_ROUTE: &str = "/openapi.json";

/// Which listeners serve a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The public listener only (`--listen`).
    Public,
    /// The admin listener only (`--admin-listen`).
    Admin,
    /// Both listeners.
    Both,
}

/// One path template and the methods it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutePath {
    /// The listeners that serve it.
    pub served: Served,
    /// The path, with `{name}` for one path segment (any text, checked by the handler).
    pub template: &'static str,
    /// The methods, as the `Allow` header of a 405 lists them (`"GET, DELETE"`).
    pub allow: &'static str,
    /// Served only with `--enable-fault-injection` (otherwise 404).
    pub fault_injection: bool,
}

impl RoutePath {
    /// The methods one by one (`allow` split at `", "`).
    pub fn methods(&self) -> impl Iterator<Item = &'static str> {
        self.allow.split(", ")
    }

    /// Whether `path` fits the template segment by segment (`{name}` fits any one
    /// segment, the empty one included).
    pub fn fits(&self, path: &str) -> bool {
        let mut wanted = self.template.split('/');
        let mut given = path.split('/');
        loop {
            match (wanted.next(), given.next()) {
                (None, None) => return true,
                (Some(w), Some(g)) if w == g || (w.starts_with('{') && w.ends_with('}')) => {}
                _ => return false,
            }
        }
    }
}

const fn path(served: Served, template: &'static str, allow: &'static str) -> RoutePath {
    RoutePath {
        served,
        template,
        allow,
        fault_injection: false,
    }
}

const fn fault(template: &'static str, allow: &'static str) -> RoutePath {
    RoutePath {
        served: Served::Admin,
        template,
        allow,
        fault_injection: true,
    }
}

/// Every route of both listeners (docs/service.md; SPEC §4 and §8).
pub const ROUTES: &[RoutePath] = &[
    path(Served::Both, "/healthz", "GET"),
    path(Served::Both, "/readyz", "GET"),
    path(Served::Both, OPENAPI_ROUTE, "GET"),
    path(Served::Public, "/accounts/{id}", "GET"),
    path(Served::Public, "/accounts/{id}/debits", "POST"),
    path(Served::Admin, "/accounts/{id}/grants", "POST"),
    path(Served::Admin, "/transfers", "POST"),
    path(Served::Public, "/spot/accounts/{account}/orders", "POST"),
    path(
        Served::Public,
        "/spot/accounts/{account}/orders/{order_id}/cancel",
        "POST",
    ),
    path(Served::Public, "/spot/accounts/{account}/balances", "GET"),
    path(Served::Admin, "/spot/accounts/{account}/deposits", "POST"),
    path(Served::Admin, "/spot/fills", "POST"),
    fault("/faults", "GET, DELETE"),
    fault("/faults/{point}", "PUT, DELETE"),
    fault("/faults/{point}/release", "POST"),
];

/// What [`lookup`] found for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A listed route and method: the router's handler answers.
    Found(&'static RoutePath),
    /// A listed path with another method: 405 with `Allow: <allow>`.
    WrongMethod(&'static RoutePath),
    /// Nothing listed at this path on this listener: 404.
    NotFound,
}

/// Looks up `method path` on the public (`admin = false`) or admin listener;
/// `fault_injection` says whether the fault routes are served.
pub fn lookup(admin: bool, fault_injection: bool, method: &str, path: &str) -> Lookup {
    let on_listener = |route: &&RoutePath| match route.served {
        Served::Both => true,
        Served::Public => !admin,
        Served::Admin => admin,
    };
    let found = ROUTES
        .iter()
        .filter(on_listener)
        .filter(|route| fault_injection || !route.fault_injection)
        .find(|route| route.fits(path));
    match found {
        None => Lookup::NotFound,
        Some(route) if route.methods().any(|m| m == method) => Lookup::Found(route),
        Some(route) => Lookup::WrongMethod(route),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fit_their_paths_only() {
        let debits = ROUTES[4];
        assert!(debits.fits("/accounts/acct-0001/debits"));
        assert!(debits.fits("/accounts//debits"));
        assert!(!debits.fits("/accounts/acct-0001"));
        assert!(!debits.fits("/accounts/acct-0001/debits/x"));
    }

    #[test]
    fn lookup_respects_listener_method_and_fault_flag() {
        assert!(matches!(
            lookup(false, false, "GET", "/accounts/a"),
            Lookup::Found(_)
        ));
        assert_eq!(lookup(true, false, "GET", "/accounts/a"), Lookup::NotFound);
        assert!(matches!(
            lookup(false, false, "PUT", "/healthz"),
            Lookup::WrongMethod(r) if r.allow == "GET"
        ));
        assert_eq!(lookup(true, false, "GET", "/faults"), Lookup::NotFound);
        assert!(matches!(
            lookup(true, true, "GET", "/faults"),
            Lookup::Found(_)
        ));
        assert_eq!(lookup(false, true, "GET", "/faults"), Lookup::NotFound);
        assert_eq!(lookup(false, false, "GET", "/nothing"), Lookup::NotFound);
    }

    #[test]
    fn no_template_is_listed_twice_on_one_listener() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert_ne!(a.template, b.template, "listed twice");
            }
        }
    }
}
