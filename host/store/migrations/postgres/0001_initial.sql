-- corral store, PostgreSQL schema, version 1.
-- Times are integer milliseconds since the Unix epoch; JSON is stored as text, byte for byte.

CREATE TABLE corral_agents (
    agent_id               TEXT    NOT NULL PRIMARY KEY,
    manifest               TEXT    NOT NULL,
    manifest_hash          TEXT    NOT NULL,
    implementation_version TEXT    NOT NULL,
    created_at             BIGINT  NOT NULL,
    updated_at             BIGINT  NOT NULL
);

-- Sessions keep a copy of the manifest they were created with, so no foreign key to agents.
CREATE TABLE corral_sessions (
    id                     TEXT    NOT NULL PRIMARY KEY,
    tenant_id              TEXT    NOT NULL,
    owner_user_id          TEXT    NOT NULL,
    agent_id               TEXT    NOT NULL,
    manifest               TEXT    NOT NULL,
    manifest_hash          TEXT    NOT NULL,
    implementation_version TEXT    NOT NULL,
    creation               TEXT    NOT NULL,
    status                 TEXT    NOT NULL,
    active_turn_id         TEXT,
    state                  TEXT    NOT NULL,
    version                BIGINT  NOT NULL,
    last_cursor            BIGINT  NOT NULL,
    last_item_seq          BIGINT  NOT NULL,
    owner_replica          TEXT,
    lease_expires_at       BIGINT,
    generation             BIGINT  NOT NULL,
    created_at             BIGINT  NOT NULL,
    updated_at             BIGINT  NOT NULL,
    closed_at              BIGINT
) WITH (fillfactor = 50);
-- Every step rewrites its session row: leaving room on the page and keeping columns that change
-- at every step out of indexes lets PostgreSQL update the row in place (a HOT update).
CREATE INDEX corral_sessions_claimable ON corral_sessions (status);
CREATE INDEX corral_sessions_closed ON corral_sessions (closed_at) WHERE closed_at IS NOT NULL;

CREATE TABLE corral_events (
    session_id TEXT    NOT NULL REFERENCES corral_sessions (id) ON DELETE CASCADE,
    cursor     BIGINT  NOT NULL,
    turn_id    TEXT,
    event_type TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at BIGINT  NOT NULL,
    PRIMARY KEY (session_id, cursor)
);

CREATE TABLE corral_items (
    session_id TEXT    NOT NULL REFERENCES corral_sessions (id) ON DELETE CASCADE,
    seq        BIGINT  NOT NULL,
    turn_id    TEXT,
    body       TEXT    NOT NULL,
    created_at BIGINT  NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE corral_checkpoints (
    session_id    TEXT    NOT NULL REFERENCES corral_sessions (id) ON DELETE CASCADE,
    turn_id       TEXT    NOT NULL,
    segment       BIGINT  NOT NULL,
    data          TEXT    NOT NULL,
    created_at    BIGINT  NOT NULL,
    updated_at    BIGINT  NOT NULL,
    superseded_at BIGINT,
    PRIMARY KEY (session_id, turn_id, segment)
);
-- One live checkpoint per session, enforced by the database.
CREATE UNIQUE INDEX corral_checkpoints_live ON corral_checkpoints (session_id)
    WHERE superseded_at IS NULL;
CREATE INDEX corral_checkpoints_superseded ON corral_checkpoints (superseded_at)
    WHERE superseded_at IS NOT NULL;

CREATE TABLE corral_effects (
    effect_id  TEXT    NOT NULL PRIMARY KEY,
    session_id TEXT    NOT NULL REFERENCES corral_sessions (id) ON DELETE CASCADE,
    turn_id    TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    status     TEXT    NOT NULL,
    request    TEXT    NOT NULL,
    result     TEXT,
    error      TEXT,
    created_at BIGINT  NOT NULL,
    updated_at BIGINT  NOT NULL
);
CREATE INDEX corral_effects_session ON corral_effects (session_id, status);

CREATE TABLE corral_actions (
    action_id              TEXT    NOT NULL PRIMARY KEY
                                   REFERENCES corral_effects (effect_id) ON DELETE CASCADE,
    session_id             TEXT    NOT NULL REFERENCES corral_sessions (id) ON DELETE CASCADE,
    turn_id                TEXT    NOT NULL,
    agent_id               TEXT    NOT NULL,
    manifest_hash          TEXT    NOT NULL,
    implementation_version TEXT    NOT NULL,
    capability_id          TEXT    NOT NULL,
    request                TEXT    NOT NULL,
    status                 TEXT    NOT NULL,
    generation             BIGINT  NOT NULL,
    claim_id               TEXT,
    lease_expires_at       BIGINT,
    result                 TEXT,
    created_at             BIGINT  NOT NULL,
    updated_at             BIGINT  NOT NULL
);
CREATE INDEX corral_actions_session ON corral_actions (session_id);
CREATE INDEX corral_actions_status ON corral_actions (status, lease_expires_at);

-- Idempotency records outlive their session for the retention window, so no foreign key.
CREATE TABLE corral_commands (
    session_id      TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    command         TEXT    NOT NULL,
    response        TEXT    NOT NULL,
    cursor          BIGINT  NOT NULL,
    created_at      BIGINT  NOT NULL,
    PRIMARY KEY (session_id, idempotency_key)
);
CREATE INDEX corral_commands_created ON corral_commands (created_at);
