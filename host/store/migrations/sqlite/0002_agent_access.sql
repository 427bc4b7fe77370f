-- corral store, embedded SQLite schema, version 2: who may use an agent.
-- owner_tenant: the tenant that owns the agent (NULL: the operator's).
-- shared_with: JSON array of the tenants an operator's agent is shared with ("*": every tenant).
ALTER TABLE corral_agents ADD COLUMN owner_tenant TEXT;
ALTER TABLE corral_agents ADD COLUMN shared_with TEXT NOT NULL DEFAULT '[]';
