//! Unit tests of the PostgreSQL store that need the crate's private rules.
//! They run against the server at `POIMEN_TEST_PG` (default
//! `postgres://postgres@127.0.0.1:5432/test`), inside one transaction that
//! is rolled back: nothing stays behind.

use tokio_postgres::NoTls;

use super::schema;
use crate::records::IntentPhase;
use crate::rules;

fn base_url() -> String {
    std::env::var("POIMEN_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `poimen_intent_may_follow`, the protocol as `poimen_commit` checks it,
/// answers exactly as `rules::intent_may_follow` for every (previous, next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_intent_protocol_is_the_rules_one() {
    let url = base_url();
    let (client, conn) = match tokio_postgres::connect(&url, NoTls).await {
        Ok(c) => c,
        Err(e) => panic!(
            "PostgreSQL is not reachable at {} ({e}). Start one with `pg_ctlcluster 15 main \
             start` or `service postgresql start`, or point POIMEN_TEST_PG at one",
            crate::redact::redact_url(&url)
        ),
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let scratch = format!("poimen_unit_{}", std::process::id());
    client
        .batch_execute(&format!(
            "BEGIN; CREATE SCHEMA {scratch}; SET LOCAL search_path = {scratch};"
        ))
        .await
        .expect("scratch schema");
    client
        .batch_execute(schema::MIGRATIONS[0].sql)
        .await
        .expect("migration 1");
    let previous = std::iter::once(None).chain(IntentPhase::ALL.map(Some));
    for prev in previous {
        for next in IntentPhase::ALL {
            let row = client
                .query_one(
                    "SELECT poimen_intent_may_follow($1, $2)",
                    &[&prev.map(IntentPhase::as_str), &next.as_str()],
                )
                .await
                .expect("query");
            let sql: bool = row.get(0);
            assert_eq!(
                sql,
                rules::intent_may_follow(prev, next),
                "{prev:?} → {next:?}"
            );
        }
    }
    client.batch_execute("ROLLBACK").await.expect("rollback");
}
