//! Checks the store's tests share across both backends.

use super::listing::{ListFilter, StateFilter};
use super::{State, Store};

/// For the upgrade tests of both backends: a store holding one record per state (ids `r0`,
/// `r1`, ... in `State::ALL` order, scopes alternating `even` and `odd`, key `key-STATE`,
/// Message-ID `mid-STATE@example.com`, accepted at 1000 + i) answers every lookup the
/// listing and the queue figures make with exactly those records.
pub(crate) async fn assert_one_record_per_state_is_findable(store: &dyn Store) {
    let stats = store.queue_stats().await.unwrap();
    for (state, n) in &stats.by_state {
        assert_eq!(*n, 1, "{state:?} counted once: {stats:?}");
    }
    assert_eq!(stats.oldest_queued_at_ms, Some(1_000));
    assert_eq!(stats.queued_by_scope, vec![("even".to_string(), 1)]);
    for (i, state) in State::ALL.into_iter().enumerate() {
        let name = state.as_str();
        let filters = [
            ListFilter {
                state: Some(StateFilter::Is(state)),
                ..ListFilter::default()
            },
            ListFilter {
                key: Some(format!("key-{name}")),
                ..ListFilter::default()
            },
            ListFilter {
                message_id: Some(format!("<mid-{name}@example.com>")),
                ..ListFilter::default()
            },
        ];
        for filter in filters {
            let filter = ListFilter {
                limit: 10,
                ..filter
            };
            let found = store.list_page(&filter).await.unwrap().records;
            assert_eq!(
                found.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
                [format!("r{i}")],
                "{filter:?}"
            );
        }
    }
}
