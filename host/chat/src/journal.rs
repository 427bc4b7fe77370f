//! The conversation store a run needs, and its implementation over any `corral_store::Store`
//! (the embedded SQLite store and PostgreSQL alike).
//!
//! The journal is what makes a turn re-executable: every model call, capability call, approval,
//! script batch and tool result has a stable id derived from its position in the turn, and a
//! completed entry is returned instead of being performed again.

use std::sync::Arc;

use async_trait::async_trait;
use corral_store::{
    BeginEffect, BeginEffectOutcome, CheckpointWrite, EffectKind, EffectStatus, EffectTransition,
    Fence, NewAction, NewCheckpoint, NewEffect, NewEvent, SessionCommit, Store, StoreError,
};
use serde_json::Value;

use crate::types::{ConversationItem, SuspensionContext};

/// A store failure, or a journal entry that does not match what the run asks for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The journaled request under this id differs from the one made now: the turn is not
    /// replaying the same way (a changed script, catalog or conversation).
    #[error("effect {effect_id} was journaled with a different request")]
    Drift {
        /// The effect.
        effect_id: String,
    },
    /// The lease this run writes under is gone (another replica took the session over).
    #[error("the session's lease was lost: {0}")]
    Fenced(String),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
    /// Stored data could not be read.
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
}

impl From<StoreError> for JournalError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::StaleGeneration { .. } => JournalError::Fenced(error.to_string()),
            other => JournalError::Store(other),
        }
    }
}

/// The state of a journal entry when a run reaches it.
#[derive(Debug, Clone, PartialEq)]
pub enum Journaled {
    /// Not journaled before: it is now (as asked), and the caller performs it.
    New,
    /// Completed before with this result: use it, do not perform it again.
    Completed(Value),
    /// Journaled, not started: external work not done yet, or an operator asked for a retry.
    Pending,
    /// Was in flight when a process died, or its outcome is otherwise unknown.
    Uncertain,
}

/// External work to create with a capability effect (kind `action`).
#[derive(Debug, Clone, PartialEq)]
pub struct ActionRequest {
    /// The capability an executor runs.
    pub capability_id: String,
    /// What the executor gets (input, tool call id...).
    pub request: Value,
}

/// The narrow store a run needs, scoped to one conversation.
#[async_trait]
pub trait ConversationStore: Send + Sync + std::fmt::Debug {
    /// The conversation items of earlier turns, in order.
    async fn history(&self) -> Result<Vec<ConversationItem>, JournalError>;

    /// How many model calls the conversation made in turns other than `turn_id` (scripted
    /// models answer by this count).
    async fn model_calls_before(&self, turn_id: &str) -> Result<u64, JournalError>;

    /// Journals an effect that the caller performs now (`invoking`), or one that external work
    /// will complete (`pending`, with `action`), unless it exists: then reports its state.
    async fn begin(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        action: Option<ActionRequest>,
    ) -> Result<Journaled, JournalError>;

    /// Journals an entry that is complete at once (a decision, a batch, a tool result), unless
    /// it exists: then returns the journaled result.
    async fn record(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        result: Value,
    ) -> Result<Journaled, JournalError>;

    /// The state of `effect_id`, without journaling anything; `None` when it was never journaled.
    async fn lookup(&self, effect_id: &str) -> Result<Option<Journaled>, JournalError>;

    /// Marks a begun effect completed with `result`.
    async fn complete(&self, effect_id: &str, result: Value) -> Result<(), JournalError>;

    /// Moves a pending effect (an operator's retry) back to invoking before performing it.
    async fn restart(&self, effect_id: &str) -> Result<(), JournalError>;

    /// Completed journal entries whose id starts with `prefix`, in journal order.
    async fn completed_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, JournalError>;

    /// Makes the permission checkpoint durable. Called before the permission event is emitted.
    async fn save_checkpoint(&self, checkpoint: &SuspensionContext) -> Result<(), JournalError>;
}

/// [`ConversationStore`] over a `corral_store::Store` session, optionally under a lease.
#[derive(Debug, Clone)]
pub struct StoreJournal {
    store: Arc<dyn Store>,
    session_id: String,
    fence: Option<Fence>,
    segment: u64,
}

impl StoreJournal {
    /// The conversation of `session_id`, written under `fence` when set. `segment` is the live
    /// checkpoint's segment (a suspension rewrites it).
    pub fn new(
        store: Arc<dyn Store>,
        session_id: impl Into<String>,
        fence: Option<Fence>,
        segment: u64,
    ) -> Self {
        StoreJournal {
            store,
            session_id: session_id.into(),
            fence,
            segment,
        }
    }

    fn existing(effect: &corral_store::Effect) -> Journaled {
        match effect.status {
            EffectStatus::Completed => {
                Journaled::Completed(effect.result.clone().unwrap_or(Value::Null))
            }
            EffectStatus::Pending => Journaled::Pending,
            // Invoking at this point means the process that began it is gone (this run holds
            // the lease): its outcome is unknown.
            _ => Journaled::Uncertain,
        }
    }

    async fn begin_effect(
        &self,
        effect_id: &str,
        new: NewEffect,
        action: Option<NewAction>,
        events: Vec<NewEvent>,
    ) -> Result<Journaled, JournalError> {
        let mut begin = BeginEffect::new(self.session_id.clone(), new);
        begin.fence = self.fence.clone();
        begin.action = action;
        begin.events = events;
        match self.store.begin_effect(begin).await {
            Ok(BeginEffectOutcome::Started { .. }) => Ok(Journaled::New),
            Ok(BeginEffectOutcome::Existing(effect)) => Ok(Self::existing(&effect)),
            Ok(_) => Err(JournalError::Corrupt(format!(
                "effect {effect_id}: the store answered in a way this version does not know"
            ))),
            Err(StoreError::Conflict { .. }) => Err(JournalError::Drift {
                effect_id: effect_id.to_string(),
            }),
            Err(error) => Err(error.into()),
        }
    }
}

#[async_trait]
impl ConversationStore for StoreJournal {
    async fn history(&self) -> Result<Vec<ConversationItem>, JournalError> {
        let mut items = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .store
                .page_items(&self.session_id, after, corral_store::MAX_PAGE)
                .await?;
            for item in page.items {
                let parsed: ConversationItem = serde_json::from_value(item.body)
                    .map_err(|e| JournalError::Corrupt(format!("item {}: {e}", item.seq)))?;
                items.push(parsed);
            }
            match page.next_after {
                Some(next) => after = next,
                None => return Ok(items),
            }
        }
    }

    async fn model_calls_before(&self, turn_id: &str) -> Result<u64, JournalError> {
        let effects = self.store.list_effects(&self.session_id, None).await?;
        Ok(effects
            .iter()
            .filter(|e| e.kind == EffectKind::ModelCall && e.turn_id != turn_id)
            .count() as u64)
    }

    async fn begin(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        action: Option<ActionRequest>,
    ) -> Result<Journaled, JournalError> {
        let (status, action, events) = match action {
            Some(action) => {
                let session = self.store.get_session(&self.session_id).await?;
                let event = NewEvent::new(
                    "action.pending",
                    serde_json::json!({
                        "actionId": effect_id,
                        "kind": "action",
                        "toolName": action.capability_id,
                        "input": action.request.get("input").cloned().unwrap_or(Value::Null),
                    }),
                )
                .in_turn(turn_id);
                let new = NewAction::new(
                    session.agent_id,
                    session.manifest_hash,
                    session.implementation_version,
                    action.capability_id,
                    action.request,
                );
                (EffectStatus::Pending, Some(new), vec![event])
            }
            None => (EffectStatus::Invoking, None, Vec::new()),
        };
        let new = NewEffect::new(effect_id, turn_id, kind, status, request);
        self.begin_effect(effect_id, new, action, events).await
    }

    async fn record(
        &self,
        turn_id: &str,
        effect_id: &str,
        kind: EffectKind,
        request: Value,
        result: Value,
    ) -> Result<Journaled, JournalError> {
        let new = NewEffect::completed(effect_id, turn_id, kind, request, result);
        self.begin_effect(effect_id, new, None, Vec::new()).await
    }

    async fn lookup(&self, effect_id: &str) -> Result<Option<Journaled>, JournalError> {
        match self.store.get_effect(effect_id).await {
            Ok(effect) if effect.session_id == self.session_id => Ok(Some(Self::existing(&effect))),
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    async fn complete(&self, effect_id: &str, result: Value) -> Result<(), JournalError> {
        let mut commit = SessionCommit::new(self.session_id.clone());
        commit.fence = self.fence.clone();
        commit.effects.push(
            EffectTransition::new(
                effect_id,
                &[EffectStatus::Invoking],
                EffectStatus::Completed,
            )
            .with_result(result),
        );
        self.store.commit(commit).await?;
        Ok(())
    }

    async fn restart(&self, effect_id: &str) -> Result<(), JournalError> {
        let mut commit = SessionCommit::new(self.session_id.clone());
        commit.fence = self.fence.clone();
        commit.effects.push(EffectTransition::new(
            effect_id,
            &[EffectStatus::Pending],
            EffectStatus::Invoking,
        ));
        self.store.commit(commit).await?;
        Ok(())
    }

    async fn completed_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, JournalError> {
        let effects = self
            .store
            .list_effects(&self.session_id, Some(EffectStatus::Completed))
            .await?;
        Ok(effects
            .into_iter()
            .filter(|e| e.effect_id.starts_with(prefix))
            .map(|e| (e.effect_id, e.result.unwrap_or(Value::Null)))
            .collect())
    }

    async fn save_checkpoint(&self, checkpoint: &SuspensionContext) -> Result<(), JournalError> {
        let data =
            serde_json::to_value(checkpoint).map_err(|e| JournalError::Corrupt(e.to_string()))?;
        let mut commit = SessionCommit::new(self.session_id.clone());
        commit.fence = self.fence.clone();
        commit.checkpoint = Some(CheckpointWrite::Put(NewCheckpoint::new(
            checkpoint.turn_id.clone(),
            self.segment,
            data,
        )));
        self.store.commit(commit).await?;
        Ok(())
    }
}
