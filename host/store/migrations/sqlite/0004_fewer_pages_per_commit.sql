-- corral store, embedded SQLite schema, version 4: fewer pages written per commit.
-- A commit writes every page it changes to the WAL, one write each: half of a commit's time.
-- - corral_effects without a rowid: the table is its primary key, so an effect written is one
--   B-tree fewer (the rowid table and its primary-key index were two).
-- - No index on an effect's status: every effect written rewrote its entry. What is in flight
--   is read by its turn (corral_effects_turn), what is uncertain from a partial index that only
--   uncertain effects, rare, enter.
-- - The claim index on the status alone: with the time of the last change in it, every commit
--   moved the session's entry (the claim sorts its few candidates anyway).
-- The table is rebuilt the documented way (create, copy, drop, rename): the store turns foreign
-- keys off around its migrations and checks them before it commits.
CREATE TABLE corral_effects_v4 (
    effect_id  TEXT    NOT NULL PRIMARY KEY,
    session_id TEXT    NOT NULL REFERENCES corral_sessions (id) ON DELETE CASCADE,
    turn_id    TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    status     TEXT    NOT NULL,
    request    TEXT    NOT NULL,
    result     TEXT,
    error      TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO corral_effects_v4 (effect_id, session_id, turn_id, kind, status, request, result,
                               error, created_at, updated_at)
    SELECT effect_id, session_id, turn_id, kind, status, request, result, error, created_at,
           updated_at
    FROM corral_effects;
DROP TABLE corral_effects;
ALTER TABLE corral_effects_v4 RENAME TO corral_effects;
CREATE INDEX corral_effects_turn ON corral_effects (session_id, turn_id, kind);
CREATE INDEX corral_effects_uncertain ON corral_effects (session_id) WHERE status = 'uncertain';

DROP INDEX corral_sessions_claimable;
CREATE INDEX corral_sessions_claimable ON corral_sessions (status);

-- From this version on only the active turn has effects in flight (a turn that ends marks what
-- it left invoking uncertain), which is where a start, a cancel and a recovery look for them.
-- What earlier versions left invoking in turns that are over is marked so now.
UPDATE corral_effects
SET status = 'uncertain',
    error = 'the turn ended before the effect''s outcome was recorded',
    updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE status = 'invoking'
  AND NOT EXISTS (SELECT 1 FROM corral_sessions
                  WHERE corral_sessions.id = corral_effects.session_id
                    AND corral_sessions.active_turn_id = corral_effects.turn_id);
