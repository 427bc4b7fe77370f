-- corral store, PostgreSQL schema, version 4: no index on an effect's status.
-- Every effect that began or ended rewrote its entry, and an update that changes an indexed
-- column cannot be a heap-only (HOT) update, so it wrote a new entry in every index of the
-- table. What is in flight is read by its turn (corral_effects_turn), what is uncertain from a
-- partial index that only uncertain effects, rare, enter.
DROP INDEX corral_effects_session;
CREATE INDEX corral_effects_uncertain ON corral_effects (session_id) WHERE status = 'uncertain';

-- From this version on only the active turn has effects in flight (a turn that ends marks what
-- it left invoking uncertain), which is where a start, a cancel and a recovery look for them.
-- What earlier versions left invoking in turns that are over is marked so now.
UPDATE corral_effects
SET status = 'uncertain',
    error = 'the turn ended before the effect''s outcome was recorded',
    updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
WHERE status = 'invoking'
  AND NOT EXISTS (SELECT 1 FROM corral_sessions
                  WHERE corral_sessions.id = corral_effects.session_id
                    AND corral_sessions.active_turn_id = corral_effects.turn_id);
