//! Integration tests of `reconcile_orders`: the business orders against the debits that
//! carry their order id, each kind of finding on crafted traffic.

mod common;

use points_ledger::{
    NoHooks, Order, OrderFinding, TransferRequest, grant, reconcile_orders, transfer,
};

use common::TestDb;

fn order(order_id: &str, account_id: &str, amount: i64) -> Order {
    Order {
        order_id: order_id.into(),
        account_id: account_id.into(),
        amount,
    }
}

#[tokio::test]
async fn every_kind_of_finding() {
    let mut db = TestDb::new("o_kinds").await;
    let c = &mut db.client;
    grant(c, "ops", "g-1", "acct-0001", 1000).await.unwrap();
    let paid = |key: &str, amount: i64, order: &str| {
        TransferRequest::debit("app-a", key, "acct-0001", amount).with_order(order)
    };
    for request in [
        paid("k-1", 10, "ord-once"),
        paid("k-2", 20, "ord-twice"),
        paid("k-3", 20, "ord-twice"),
        paid("k-4", 99, "ord-wrong"),
        paid("k-5", 5, "ord-unknown"),
        // Without an order id: not looked at.
        TransferRequest::debit("app-a", "k-6", "acct-0001", 7),
    ] {
        transfer(c, &request, &NoHooks).await.unwrap();
    }
    let orders = [
        order("ord-once", "acct-0001", 10),
        order("ord-twice", "acct-0001", 20),
        order("ord-wrong", "acct-0001", 30),
        order("ord-unpaid", "acct-0001", 40),
    ];
    let findings = reconcile_orders(&db.client, &orders).await.unwrap();
    assert_eq!(
        findings,
        vec![
            OrderFinding::PaidMoreThanOnce {
                order_id: "ord-twice".into(),
                debits: 2,
                keys: vec!["app-a/k-2".into(), "app-a/k-3".into()],
            },
            OrderFinding::UnknownOrder {
                order_id: "ord-unknown".into(),
                debits: 1,
            },
            OrderFinding::Unpaid {
                order_id: "ord-unpaid".into(),
            },
            OrderFinding::WrongDebit {
                order_id: "ord-wrong".into(),
                account_id: "acct-0001".into(),
                amount: 99,
            },
        ]
    );
    assert_eq!(
        findings[0].describe(),
        "order ord-twice has 2 debits (app-a/k-2, app-a/k-3)"
    );

    // Each order paid once, as ordered: nothing.
    let exact = [
        order("ord-once", "acct-0001", 10),
        order("ord-wrong", "acct-0001", 99),
        order("ord-unknown", "acct-0001", 5),
    ];
    let mut clean = reconcile_orders(&db.client, &exact).await.unwrap();
    clean.retain(|finding| !finding.describe().contains("ord-twice"));
    assert_eq!(clean, vec![]);
}
