-- corral store, PostgreSQL schema, version 3: a turn's journal is read by its turn.
-- A run reads only its turn's effects, and counts the model calls of the session's other turns
-- from this index alone, instead of reading every effect the session ever journaled.
CREATE INDEX corral_effects_turn ON corral_effects (session_id, turn_id, kind);
