//! Unit tests of the PostgreSQL store that need the crate's private rules.
//! They run against the server at `POIMEN_TEST_PG`, or a throwaway one of
//! their own (`poimen-test-pg`), inside one transaction that is rolled
//! back: nothing stays behind.

use tokio_postgres::NoTls;

use super::schema;
use crate::records::IntentPhase;
use crate::rules;

fn base_url() -> String {
    poimen_test_pg::url()
}

/// `poimen_intent_may_follow`, the protocol as `poimen_commit` checks it,
/// answers exactly as `rules::intent_may_follow` for every (previous, next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_intent_protocol_is_the_rules_one() {
    let url = base_url();
    let (client, conn) = match tokio_postgres::connect(&url, NoTls).await {
        Ok(c) => c,
        Err(e) => panic!(
            "PostgreSQL is not reachable at {} ({e}): the tests start a throwaway server of \
             their own unless POIMEN_TEST_PG names one",
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
