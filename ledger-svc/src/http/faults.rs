//! Fault injection at the transfer's named hook points (SPEC §3) and at the spot events'
//! (SPEC §8): the [`Hooks`] the service passes to every transfer and every spot event,
//! armed and cleared from the admin listener, and only when the service was started with
//! `--enable-fault-injection`. The spot points carry the prefix `spot-`
//! ([`FaultPoint`]), so a fault armed for a debit never fires inside an order and back.
//!
//! A fault is armed per hook point with an action and a count: it fires on the next
//! `count` transfers that pass the point (1 = one-shot), then disarms itself. At a spot
//! point it may be narrowed to one kind of event (`"event": "FILL"`, `"CANCEL"`,
//! `"PLACE"`, `"DEPOSIT"`): other events pass without firing it or using up its count, so
//! a case can hold a fill while a cancel of the same order runs, and the reverse. A
//! fault with an `event` never fires at a ledger point (a transfer has no event kind).
//!
//! - `delay`: wait `hold_ms`, then go on.
//! - `pause`: wait until released from the admin listener (or `hold_ms` passes), then go
//!   on. A case uses it to hold a transaction at a known point, not for a guessed time.
//!   Without `hold_ms` a pause holds until released, bounded by [`MAX_FAULT_HOLD_MS`]
//!   (the state then reports that bound as its `hold_ms`). Note that a transaction held
//!   longer than the service's idle-in-transaction bound is ended by the server.
//! - `close`: wait `hold_ms`, then abort: before `after-commit` the transaction rolls
//!   back; at `after-commit` it stays committed. Either way the client's connection is
//!   closed without a response (a lost response, SPEC §6 L7).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use points_ledger::{HookAbort, HookContext, HookPoint, Hooks};
use serde::{Deserialize, Serialize, Serializer};
use tokio::sync::watch;

/// Longest `hold_ms` a fault may ask for, milliseconds.
pub const MAX_FAULT_HOLD_MS: u64 = 60_000;
/// Largest `count` a fault may ask for.
pub const MAX_FAULT_COUNT: u32 = 1_000_000;

/// A point where a fault can be armed: a transfer's hook point (`registered`, …) or a
/// spot event's (`spot-registered`, `spot-balances-updated`, `spot-before-commit`,
/// `spot-after-commit`; every spot event — place, fill, cancel, deposit — passes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Inside a ledger transfer.
    Ledger(HookPoint),
    /// Inside a spot event.
    Spot(frozen_balances::HookPoint),
}

impl FaultPoint {
    /// Every point: the ledger's four, then the spot events' four.
    pub const ALL: [FaultPoint; 8] = [
        FaultPoint::Ledger(HookPoint::Registered),
        FaultPoint::Ledger(HookPoint::EntriesWritten),
        FaultPoint::Ledger(HookPoint::BeforeCommit),
        FaultPoint::Ledger(HookPoint::AfterCommit),
        FaultPoint::Spot(frozen_balances::HookPoint::Registered),
        FaultPoint::Spot(frozen_balances::HookPoint::BalancesUpdated),
        FaultPoint::Spot(frozen_balances::HookPoint::BeforeCommit),
        FaultPoint::Spot(frozen_balances::HookPoint::AfterCommit),
    ];

    /// The name in a route: the ledger's as is, the spot's with the prefix `spot-`.
    pub fn name(self) -> String {
        match self {
            FaultPoint::Ledger(point) => point.as_str().to_owned(),
            FaultPoint::Spot(point) => format!("{SPOT_PREFIX}{}", point.as_str()),
        }
    }
}

/// Prefix of the spot events' fault points.
pub const SPOT_PREFIX: &str = "spot-";

impl std::str::FromStr for FaultPoint {
    type Err = ();

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.strip_prefix(SPOT_PREFIX) {
            Some(spot) => spot.parse().map(FaultPoint::Spot).map_err(|_| ()),
            None => name.parse().map(FaultPoint::Ledger).map_err(|_| ()),
        }
    }
}

impl std::fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for FaultPoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name())
    }
}

/// What an armed fault does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultAction {
    /// Wait `hold_ms`, then continue.
    Delay,
    /// Wait for a release (or `hold_ms`), then continue.
    Pause,
    /// Wait `hold_ms`, then abort the transfer and close the connection without a response.
    Close,
}

/// The ledger hooks a transfer runs with: the armed faults, or none without
/// `--enable-fault-injection`.
pub fn ledger_hooks(faults: Option<&FaultHooks>) -> &dyn Hooks {
    match faults {
        Some(faults) => faults,
        None => &points_ledger::NoHooks,
    }
}

/// The spot hooks an event runs with: the armed faults, or none without
/// `--enable-fault-injection`.
pub fn spot_hooks(faults: Option<&FaultHooks>) -> &dyn frozen_balances::Hooks {
    match faults {
        Some(faults) => faults,
        None => &frozen_balances::NoHooks,
    }
}

/// The spot events this service's routes run, and so the only ones a fault may be
/// narrowed to (`super::spot`: placements, fills, cancels, deposits).
pub const SERVED_EVENTS: [frozen_balances::EventKind; 4] = [
    frozen_balances::EventKind::Place,
    frozen_balances::EventKind::Fill,
    frozen_balances::EventKind::Cancel,
    frozen_balances::EventKind::Deposit,
];

/// The body of `PUT /faults/{point}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// What to do.
    pub action: FaultAction,
    /// How long to hold, milliseconds (for `pause`, the longest wait for a release), at
    /// most [`MAX_FAULT_HOLD_MS`]. When absent: 0 for `delay` and `close`, and
    /// [`MAX_FAULT_HOLD_MS`] for `pause` (hold until released). See [`FaultSpec::hold`].
    #[serde(default)]
    pub hold_ms: Option<u64>,
    /// How many transfers it fires for; default 1 (one-shot), 1 to [`MAX_FAULT_COUNT`].
    #[serde(default = "one")]
    pub count: u32,
    /// Only spot events of this kind fire it; default any event.
    #[serde(default)]
    pub event: Option<frozen_balances::EventKind>,
}

fn one() -> u32 {
    1
}

impl FaultSpec {
    /// Checks the limits, and that a fault narrowed to an `event` is armed where such an
    /// event passes: at a spot point, for one of [`SERVED_EVENTS`] (a withdrawal runs in
    /// the withdrawal executor, never in this service; a ledger transfer has no event kind).
    ///
    /// Errors: a text for the client naming the broken limit or the point and the events.
    pub fn validate(&self, point: FaultPoint) -> Result<(), String> {
        if let Some(event) = self.event {
            if matches!(point, FaultPoint::Ledger(_)) {
                return Err(format!(
                    "event narrows a fault to one kind of spot event; {point} is passed by \
                     ledger transfers, which have none (leave event out)"
                ));
            }
            if !SERVED_EVENTS.contains(&event) {
                let served: Vec<&str> = SERVED_EVENTS.iter().map(|e| e.as_str()).collect();
                return Err(format!(
                    "no route of this service runs a {} event, so the fault would never fire; \
                     {point} is passed by {}",
                    event.as_str(),
                    served.join(", ")
                ));
            }
        }
        if self.hold_ms.is_some_and(|hold| hold > MAX_FAULT_HOLD_MS) {
            return Err(format!("hold_ms must be at most {MAX_FAULT_HOLD_MS}"));
        }
        if !(1..=MAX_FAULT_COUNT).contains(&self.count) {
            return Err(format!("count must be 1 to {MAX_FAULT_COUNT}"));
        }
        Ok(())
    }
}

impl FaultSpec {
    /// The hold in milliseconds: `hold_ms`, or when absent [`MAX_FAULT_HOLD_MS`] for a
    /// pause (held until released) and 0 for the other actions.
    pub fn hold(&self) -> u64 {
        match (self.hold_ms, self.action) {
            (Some(hold), _) => hold,
            (None, FaultAction::Pause) => MAX_FAULT_HOLD_MS,
            (None, _) => 0,
        }
    }
}

/// A hook point's fault, as reported by `GET /faults`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultState {
    /// The fault point.
    pub point: FaultPoint,
    /// The armed action, `null` when nothing was armed since the last clear.
    pub action: Option<FaultAction>,
    /// The armed hold, milliseconds.
    pub hold_ms: u64,
    /// How many more transfers it will fire for (0: disarmed).
    pub remaining: u32,
    /// How many times it fired since armed.
    pub fired: u64,
    /// How many transfers are inside its hold right now.
    pub holding: u32,
    /// The kind of spot event it is narrowed to, `null` for any.
    pub event: Option<frozen_balances::EventKind>,
}

struct Slot {
    spec: Option<FaultSpec>,
    remaining: u32,
    fired: u64,
    holding: u32,
    /// Bumped by a release; paused transfers wait for a change.
    release: watch::Sender<u64>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            spec: None,
            remaining: 0,
            fired: 0,
            holding: 0,
            release: watch::Sender::new(0),
        }
    }
}

/// The service's [`Hooks`]: per hook point, an optional armed fault.
pub struct FaultHooks {
    slots: Mutex<HashMap<FaultPoint, Slot>>,
}

impl Default for FaultHooks {
    fn default() -> Self {
        FaultHooks::new()
    }
}

impl FaultHooks {
    /// Nothing armed.
    pub fn new() -> FaultHooks {
        FaultHooks {
            slots: Mutex::new(
                FaultPoint::ALL
                    .into_iter()
                    .map(|p| (p, Slot::new()))
                    .collect(),
            ),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<FaultPoint, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arms `spec` at `point`, replacing what was there and resetting its counters.
    pub fn arm(&self, point: FaultPoint, spec: FaultSpec) -> FaultState {
        let mut slots = self.slots();
        let slot = slots.entry(point).or_insert_with(Slot::new);
        slot.spec = Some(spec);
        slot.remaining = spec.count;
        slot.fired = 0;
        state(point, slot)
    }

    /// Disarms `point` and resets its counters (transfers already holding go on).
    pub fn clear(&self, point: FaultPoint) -> FaultState {
        let mut slots = self.slots();
        let slot = slots.entry(point).or_insert_with(Slot::new);
        slot.spec = None;
        slot.remaining = 0;
        slot.fired = 0;
        state(point, slot)
    }

    /// Releases every transfer paused at `point`; returns how many were holding there.
    pub fn release(&self, point: FaultPoint) -> u32 {
        let slots = self.slots();
        let Some(slot) = slots.get(&point) else {
            return 0;
        };
        slot.release.send_modify(|generation| *generation += 1);
        slot.holding
    }

    /// The state of every fault point, in [`FaultPoint::ALL`] order.
    pub fn states(&self) -> Vec<FaultState> {
        let slots = self.slots();
        FaultPoint::ALL
            .into_iter()
            .filter_map(|point| slots.get(&point).map(|slot| state(point, slot)))
            .collect()
    }

    fn hold_done(&self, point: FaultPoint) {
        if let Some(slot) = self.slots().get_mut(&point) {
            slot.holding = slot.holding.saturating_sub(1);
        }
    }
}

fn state(point: FaultPoint, slot: &Slot) -> FaultState {
    FaultState {
        point,
        action: slot.spec.map(|s| s.action),
        hold_ms: slot.spec.map_or(0, |s| s.hold()),
        remaining: slot.remaining,
        fired: slot.fired,
        holding: slot.holding,
        event: slot.spec.and_then(|s| s.event),
    }
}

/// Decrements `holding` when the hold ends, also if the transfer's task is cancelled.
struct Holding<'a> {
    hooks: &'a FaultHooks,
    point: FaultPoint,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.hooks.hold_done(self.point);
    }
}

impl FaultHooks {
    /// Fires the fault armed at `point`, if any and if it is for `event` (`None`: a
    /// ledger transfer); `Err(())` for a `close`. `what` names the request in the log.
    fn fire<'a>(
        &'a self,
        point: FaultPoint,
        event: Option<frozen_balances::EventKind>,
        what: String,
    ) -> BoxFuture<'a, Result<(), ()>> {
        // Take the fault (if armed) and subscribe to releases under one lock, so a release
        // sent right after firing is not missed.
        let fired = {
            let mut slots = self.slots();
            match slots.get_mut(&point) {
                Some(slot)
                    if slot.remaining > 0
                        && slot
                            .spec
                            .is_some_and(|spec| spec.event.is_none_or(|e| Some(e) == event)) =>
                {
                    slot.remaining -= 1;
                    slot.fired += 1;
                    slot.holding += 1;
                    let mut released = slot.release.subscribe();
                    released.mark_unchanged();
                    slot.spec.map(|spec| (spec, released))
                }
                _ => None,
            }
        };
        let Some((spec, mut released)) = fired else {
            return Box::pin(std::future::ready(Ok(())));
        };
        Box::pin(async move {
            let _holding = Holding { hooks: self, point };
            // Injected on purpose: the request's bound does not count it.
            let _held = super::bound::hold_started();
            let hold = Duration::from_millis(spec.hold());
            eprintln!(
                "ledger-svc: fault {:?} fired at {point} for {what} (hold_ms={})",
                spec.action,
                spec.hold()
            );
            match spec.action {
                FaultAction::Delay => {
                    tokio::time::sleep(hold).await;
                    Ok(())
                }
                FaultAction::Pause => {
                    let _ = tokio::time::timeout(hold, released.changed()).await;
                    Ok(())
                }
                FaultAction::Close => {
                    tokio::time::sleep(hold).await;
                    Err(())
                }
            }
        })
    }
}

impl Hooks for FaultHooks {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        let point = FaultPoint::Ledger(ctx.point);
        let what = format!("{} {}", ctx.request.kind.as_str(), ctx.request.idem_key);
        let fired = self.fire(point, None, what);
        Box::pin(async move {
            fired
                .await
                .map_err(|()| HookAbort::new(format!("fault close at {point}")))
        })
    }
}

impl frozen_balances::Hooks for FaultHooks {
    fn at<'a>(
        &'a self,
        ctx: frozen_balances::HookContext<'a>,
    ) -> BoxFuture<'a, Result<(), frozen_balances::HookAbort>> {
        let point = FaultPoint::Spot(ctx.point);
        let what = format!("{} {}/{}", ctx.event, ctx.tenant_id, ctx.business_id);
        let fired = self.fire(point, Some(ctx.event), what);
        Box::pin(async move {
            fired
                .await
                .map_err(|()| frozen_balances::HookAbort::new(format!("fault close at {point}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use frozen_balances::{EventKind, Hooks as SpotHooks};

    fn spot_ctx(event: EventKind) -> frozen_balances::HookContext<'static> {
        frozen_balances::HookContext {
            point: frozen_balances::HookPoint::BeforeCommit,
            event,
            tenant_id: "default",
            business_id: "b-1",
            transaction: None,
        }
    }

    #[test]
    fn an_event_is_accepted_only_where_it_passes() {
        let spec = |event: &str| -> FaultSpec {
            serde_json::from_str(&format!(r#"{{"action": "close", "event": "{event}"}}"#)).unwrap()
        };
        let spot = FaultPoint::Spot(frozen_balances::HookPoint::BeforeCommit);
        let ledger = FaultPoint::Ledger(HookPoint::BeforeCommit);
        for event in ["PLACE", "FILL", "CANCEL", "DEPOSIT"] {
            assert_eq!(spec(event).validate(spot), Ok(()), "{event}");
            assert!(spec(event).validate(ledger).unwrap_err().contains("ledger"));
        }
        for event in ["WITHDRAW", "WITHDRAW_SETTLE"] {
            let error = spec(event).validate(spot).unwrap_err();
            assert!(error.contains("would never fire"), "{error}");
        }
        let any: FaultSpec = serde_json::from_str(r#"{"action": "close"}"#).unwrap();
        assert_eq!(any.validate(ledger), Ok(()));
    }

    #[tokio::test]
    async fn a_fault_for_one_event_kind_lets_the_others_pass() {
        let hooks = FaultHooks::new();
        let point = FaultPoint::Spot(frozen_balances::HookPoint::BeforeCommit);
        let spec: FaultSpec =
            serde_json::from_str(r#"{"action": "close", "event": "FILL"}"#).unwrap();
        hooks.arm(point, spec);
        // A cancel passes the point: nothing fires, the count is not used up.
        assert!(
            SpotHooks::at(&hooks, spot_ctx(EventKind::Cancel))
                .await
                .is_ok()
        );
        let state = hooks
            .states()
            .into_iter()
            .find(|s| s.point == point)
            .unwrap();
        assert_eq!((state.fired, state.remaining), (0, 1));
        assert_eq!(state.event, Some(EventKind::Fill));
        // The fill fires it.
        assert!(
            SpotHooks::at(&hooks, spot_ctx(EventKind::Fill))
                .await
                .is_err()
        );
        let state = hooks
            .states()
            .into_iter()
            .find(|s| s.point == point)
            .unwrap();
        assert_eq!((state.fired, state.remaining), (1, 0));
        // Without `event`, any kind fires it.
        hooks.arm(
            point,
            serde_json::from_str(r#"{"action": "close"}"#).unwrap(),
        );
        assert!(
            SpotHooks::at(&hooks, spot_ctx(EventKind::Deposit))
                .await
                .is_err()
        );
        assert!(
            serde_json::from_str::<FaultSpec>(r#"{"action": "close", "event": "fill"}"#).is_err()
        );
    }

    #[test]
    fn fault_point_names_round_trip() {
        let names: Vec<String> = FaultPoint::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "registered",
                "entries-written",
                "before-commit",
                "after-commit",
                "spot-registered",
                "spot-balances-updated",
                "spot-before-commit",
                "spot-after-commit"
            ]
        );
        for point in FaultPoint::ALL {
            assert_eq!(point.name().parse::<FaultPoint>(), Ok(point));
        }
        for bad in [
            "spot-entries-written",
            "balances-updated",
            "spot-",
            "after_commit",
        ] {
            assert!(bad.parse::<FaultPoint>().is_err(), "{bad}");
        }
    }
}
