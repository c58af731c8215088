"""Which of Hermes Agent 0.19.0's store tests run against `state.hermes.compat`, and why the rest
do not. Each skipped test is named with its reason; the reasons are the issue's categories:
Hermes private helpers and exact internal outputs, and Hermes application features that
are not a session store's."""

from __future__ import annotations

# test_hermes_state_wal_fallback.py (the WAL fallback helper and init-error formatting) and
# test_state_db_malformed_repair.py (Hermes's sqlite_master surgery) test Hermes-specific
# helpers and are not run; see the module docstring of tests/state/hermes/hermes_suite.py.
FILES = ("test_hermes_state.py", "test_hermes_state_compression_locks.py")

_R0 = (
    "Hermes's WAL-mode helper apply_wal_with_fallback (NFS/SMB fallback, macOS fsync "
    "barriers): a Hermes-specific helper, not store behaviour"
)

_R1 = (
    "exact output of Hermes's private FTS5 query sanitiser (_sanitize_fts5_query); the "
    "public behaviour (bad queries give [], long ones are cut) is tested through "
    "search_messages"
)

_R2 = (
    "Hermes private helper (SessionDB._contains_cjk, _is_fts5_unavailable_error, "
    "_is_trigram_unavailable_error, _get_session_rich_row, _parse_schema_columns)"
)

_R3 = (
    "simulates an SQLite build without FTS5/trigram by patching "
    "hermes_state.sqlite3.connect with a private cursor factory and reads private flags "
    "(_fts_enabled): Hermes internals"
)

_R4 = (
    "reads the source of Hermes's SessionDB.__init__ for its sqlite3.connect timeout: an "
    "internal detail"
)

_R5 = (
    "Hermes's write-path FTS optimize cadence and its trigram table (internal counters "
    "and object names)"
)

_R6 = (
    "cron-run listing: a Hermes application feature (its cron job session naming), not a "
    "session store's"
)

_R7 = (
    "Telegram DM topic mode: a Hermes application feature (switchboard keys forum topics "
    "through its session keys)"
)

_R8 = (
    "cleanup of Hermes's legacy transcript files ({id}.json/.jsonl, request dumps) in a "
    "sessions_dir: a Hermes application feature"
)

_R9 = "Hermes's own version-gated data migrations (v9-v20 steps replayed for old Hermes files)"

_R12 = (
    "asserts that Hermes's schema_version counter reads its own SCHEMA_VERSION (22) after an "
    "old Hermes file (v2, v10) is opened: that counter records which of Hermes's own "
    "version-gated data migrations have run (v16 delegate tagging, v17/v20 usage seeding, "
    "v18 sessions.json backfill). The facade does not run them, so it leaves the counter "
    "for Hermes to run them on its next open. The store behaviour these tests also check "
    "(missing columns added, tool names and arguments searchable) is covered by "
    "tests/state/test_compat_legacy_files.py"
)

_R10 = "compression failure cooldown / fallback streak: Hermes compression state"

_R11 = "memory-context stripping: Hermes's agent memory feature"

SKIP: dict[str, str] = {
    "test_hermes_state.py::TestApplyWalProbe::test_apply_wal_concurrent_connects_no_eio": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_checkpoint_fullsync_barrier_skipped_off_darwin": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_fallback_to_delete_still_works": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_macos_barrier_applied_when_already_wal": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_macos_checkpoint_fullsync_barrier_applied": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_macos_synchronous_full_enforced_already_wal": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_macos_synchronous_full_enforced_fresh": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_no_downgrade_from_wal_to_delete_on_eio": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_probe_failure_falls_through_to_set_pragma": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_returns_wal_not_delete_from_probe": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_sets_wal_on_fresh_connection": _R0,
    "test_hermes_state.py::TestApplyWalProbe::test_skips_set_pragma_when_already_wal": _R0,
    "test_hermes_state.py::TestFTS5Search::test_sanitize_fts5_preserves_quoted_phrases": _R1,
    "test_hermes_state.py::TestFTS5Search::test_sanitize_fts5_query_runtime_is_bounded": _R1,
    "test_hermes_state.py::TestFTS5Search::test_sanitize_fts5_query_strips_dangerous_chars": _R1,
    "test_hermes_state.py::TestFTS5Search::test_sanitize_fts5_quotes_dotted_terms": _R1,
    "test_hermes_state.py::TestFTS5Search::test_sanitize_fts5_quotes_hyphenated_terms": _R1,
    "test_hermes_state.py::TestFTS5Search::test_sanitize_fts5_quotes_underscored_terms": _R1,
    "test_hermes_state.py::TestCJKSearchFallback::test_cjk_detection_covers_all_ranges": _R2,
    "test_hermes_state.py::TestSessionLifecycle::test_is_fts5_unavailable_error_catches_trigram_tokenizer": _R2,
    "test_hermes_state.py::TestSessionLifecycle::test_is_trigram_unavailable_error": _R2,
    "test_hermes_state.py::TestCompactRows::test_get_session_rich_row_compact_omits_system_prompt": _R2,
    "test_hermes_state.py::TestCompactRows::test_get_session_rich_row_full_includes_system_prompt": _R2,
    "test_hermes_state.py::TestSchemaInit::test_schema_sql_is_source_of_truth": _R2,
    "test_hermes_state.py::TestSessionLifecycle::test_db_initializes_without_fts5_module": _R3,
    "test_hermes_state.py::TestSessionLifecycle::test_db_initializes_without_trigram_tokenizer": _R3,
    "test_hermes_state.py::TestSessionLifecycle::test_existing_fts_tables_do_not_break_without_fts5": _R3,
    "test_hermes_state.py::TestSessionLifecycle::test_fts_runtime_restores_triggers_after_no_fts_open": _R3,
    "test_hermes_state.py::TestSessionLifecycle::test_old_schema_without_fts5_does_not_crash": _R3,
    "test_hermes_state.py::TestSessionLifecycle::test_v11_migration_backfills_base_fts_when_trigram_unavailable": _R3,
    "test_hermes_state.py::TestSessionLifecycle::test_base_fts_rebuilds_after_trigger_repair_without_trigram": _R3,
    "test_hermes_state.py::TestConcurrentWriteSafety::test_sqlite_timeout_is_at_least_30s": _R4,
    "test_hermes_state.py::TestOptimizeFts::test_write_path_optimize_failure_never_breaks_write": _R5,
    "test_hermes_state.py::TestOptimizeFts::test_write_path_optimizes_fts_on_cadence": _R5,
    "test_hermes_state.py::TestOptimizeFts::test_optimize_skips_missing_trigram_table": _R5,
    "test_hermes_state.py::TestListCronJobRuns::test_ignores_non_cron_sessions": _R6,
    "test_hermes_state.py::TestListCronJobRuns::test_limit_and_offset_paging": _R6,
    "test_hermes_state.py::TestListCronJobRuns::test_prefix_match_excludes_substring_collision": _R6,
    "test_hermes_state.py::TestListCronJobRuns::test_scopes_to_job_newest_first_and_enriched": _R6,
    "test_hermes_state.py::TestListCronJobRuns::test_uses_index_range_scan": _R6,
    "test_hermes_state.py::TestSchemaInit::test_apply_telegram_topic_migration_creates_topic_tables_explicitly": _R7,
    "test_hermes_state.py::TestSchemaInit::test_list_unlinked_telegram_sessions_for_user_excludes_bound_and_other_users": _R7,
    "test_hermes_state.py::TestSchemaInit::test_telegram_topic_binding_refuses_to_relink_session_to_another_topic": _R7,
    "test_hermes_state.py::TestSchemaInit::test_telegram_topic_binding_roundtrip_requires_explicit_schema": _R7,
    "test_hermes_state.py::TestAutoMaintenance::test_auto_prune_deletes_transcript_files": _R8,
    "test_hermes_state.py::TestAutoMaintenance::test_prune_sessions_deletes_files_for_pruned_only": _R8,
    "test_hermes_state.py::TestBulkDeleteSessions::test_cleans_up_transcript_files": _R8,
    "test_hermes_state.py::TestDeleteEmptySessions::test_cleans_up_on_disk_transcript_files": _R8,
    "test_hermes_state.py::TestSessionLifecycle::test_v17_backfill_seeds_existing_session_usage": _R9,
    "test_hermes_state.py::TestListSessionsRich::test_v16_migration_tags_linked_delegate_rows": _R9,
    "test_hermes_state.py::TestListSessionsRich::test_v16_migration_tags_orphaned_delegate_rows": _R9,
    "test_hermes_state.py::test_v18_backfill_from_sessions_json": _R9,
    "test_hermes_state.py::TestSchemaInit::test_v9_migration_skips_v10_trigram_backfill_before_v11_rebuild": _R9,
    "test_hermes_state.py::TestSchemaInit::test_migration_from_v2": _R12,
    "test_hermes_state.py::TestFTS5ToolCallMigration::test_v10_to_v11_upgrade_backfills_tool_fields": _R12,
    "test_hermes_state.py::test_compression_failure_cooldown_round_trips_and_clears": _R10,
    "test_hermes_state.py::test_expired_compression_failure_cooldown_is_ignored": _R10,
    "test_hermes_state.py::test_compression_fallback_streak_round_trips": _R10,
    "test_hermes_state.py::TestMessageStorage::test_get_messages_as_conversation_strips_leaked_memory_context": _R11,
}

# In scope but not passing (so not skipped); the CI test fails when one of these starts
# passing (take it off the list) or when any other test fails. Empty: every test in scope
# passes.
KNOWN_FAILING: frozenset[str] = frozenset()
