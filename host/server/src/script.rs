//! A [`TurnRunner`] driven by a little script in the user's message, so that every behaviour of
//! the server can be exercised before (and beside) the chat runtime: the tests, the crash loop
//! and `corral serve` until the chat runtime is plugged in.
//!
//! The message is a list of words run in order, each with a stable effect or interaction id
//! `TURN:INDEX`:
//! - `tool`: an in-process capability call, journaled (invoking, then completed); a completed one
//!   is skipped on replay, an invoking or uncertain one makes the turn uncertain;
//! - `action`: external work for an executor (`demo.action`); the turn waits until it completes;
//! - `pause` / `input`: an approval / input interaction; the turn pauses until decided;
//! - `slow` (300 ms) or `sleep:MS`: waits, observing cancellation;
//! - `events:N`: appends N `test.tick` events;
//! - `fail`: the turn fails; `panic`: the runner panics;
//! - anything else is text. At the end the turn completes with `{"text": "done: MESSAGE"}`.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use corral_store::{
    BeginEffect, BeginEffectOutcome, EffectKind, EffectStatus, EffectTransition, NewAction,
    NewEffect, NewEvent, SessionCommit, StoreError,
};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::manifest::canonical_json;
use crate::runner::{Interaction, TurnJob, TurnOutcome, TurnRunner};

/// The capability id of `action` steps.
pub const ACTION_CAPABILITY: &str = "demo.action";

/// The scripted runner.
#[derive(Debug, Default, Clone)]
pub struct ScriptRunner {
    effect_log: Option<PathBuf>,
}

impl ScriptRunner {
    /// A runner; each performed `tool` effect's id is appended (and synced) to `effect_log`
    /// before it is performed, so a test can prove that none runs twice.
    pub fn new(effect_log: Option<PathBuf>) -> ScriptRunner {
        ScriptRunner { effect_log }
    }

    fn log_effect(&self, effect_id: &str) {
        if let Some(path) = &self.effect_log
            && let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            // One write per line: with `O_APPEND` a single write lands whole, while `writeln!`
            // on a file writes the id and the newline separately, so two sessions logging at
            // once could interleave them.
            let _ = file.write_all(format!("{effect_id}\n").as_bytes());
            let _ = file.sync_data();
        }
    }
}

enum Step {
    Next,
    End(TurnOutcome),
}

fn failed(code: &str, message: impl Into<String>) -> TurnOutcome {
    TurnOutcome::Failed {
        code: code.to_owned(),
        message: message.into(),
    }
}

fn store_failure(error: StoreError) -> Step {
    match error {
        StoreError::StaleGeneration { .. } => Step::End(TurnOutcome::Cancelled),
        other => Step::End(failed("store_error", other.to_string())),
    }
}

#[async_trait]
impl TurnRunner for ScriptRunner {
    async fn run(&self, job: TurnJob) -> TurnOutcome {
        let message = job.checkpoint.message.clone();
        let words: Vec<&str> = message.split_whitespace().collect();
        let mut text = Vec::new();
        for (index, word) in words.iter().enumerate() {
            if job.cancel.is_cancelled() {
                return TurnOutcome::Cancelled;
            }
            let id = format!("{}:{index}", job.turn_id);
            let step = match *word {
                "tool" => self.tool(&job, &id).await,
                "action" => action(&job, &id).await,
                "pause" => interaction(&job, &id, "approval").await,
                "input" => interaction(&job, &id, "input").await,
                "slow" => sleep(&job, Duration::from_millis(300)).await,
                "fail" => Step::End(failed("scripted_failure", "the script asked to fail")),
                "panic" => panic!("the script asked the runner to panic"),
                word if word.starts_with("sleep:") => {
                    let ms = word["sleep:".len()..].parse().unwrap_or(100);
                    sleep(&job, Duration::from_millis(ms)).await
                }
                word if word.starts_with("events:") => {
                    let n: u64 = word["events:".len()..].parse().unwrap_or(1);
                    ticks(&job, n).await
                }
                word => {
                    text.push(word.to_owned());
                    Step::Next
                }
            };
            if let Step::End(outcome) = step {
                return outcome;
            }
        }
        let reply = format!("done: {message}");
        TurnOutcome::Completed {
            output: json!({"text": reply, "steps": words.len()}),
            items: vec![
                json!({"role": "user", "content": message}),
                json!({"role": "assistant", "content": reply}),
            ],
        }
    }
}

impl ScriptRunner {
    async fn tool(&self, job: &TurnJob, id: &str) -> Step {
        let mut begin = BeginEffect::new(
            &job.session.id,
            NewEffect::new(
                id,
                &job.turn_id,
                EffectKind::CapabilityCall,
                EffectStatus::Invoking,
                json!({"capabilityId": "examples.echo", "input": {"id": id}}),
            ),
        );
        begin.fence = Some(job.fence.clone());
        begin.events.push(
            NewEvent::new(
                "tool.started",
                json!({"effectId": id, "capabilityId": "examples.echo"}),
            )
            .in_turn(&job.turn_id),
        );
        match job.store.begin_effect(begin).await {
            Ok(BeginEffectOutcome::Started { .. }) => {}
            Ok(BeginEffectOutcome::Existing(effect)) => match effect.status {
                EffectStatus::Completed => return Step::Next,
                EffectStatus::Pending => {
                    // An operator asked for a retry.
                    let mut commit = SessionCommit::new(&job.session.id);
                    commit.fence = Some(job.fence.clone());
                    commit.effects.push(EffectTransition::new(
                        id,
                        &[EffectStatus::Pending],
                        EffectStatus::Invoking,
                    ));
                    if let Err(error) = job.store.commit(commit).await {
                        return store_failure(error);
                    }
                }
                EffectStatus::Cancelled => {
                    return Step::End(failed("effect_cancelled", "an effect was cancelled"));
                }
                _ => {
                    return Step::End(TurnOutcome::Uncertain {
                        effect_ids: vec![id.to_owned()],
                    });
                }
            },
            Ok(_) => return Step::End(failed("store_error", "unknown effect outcome")),
            Err(error) => return store_failure(error),
        }
        self.log_effect(id);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut commit = SessionCommit::new(&job.session.id);
        commit.fence = Some(job.fence.clone());
        commit.effects.push(
            EffectTransition::new(id, &[EffectStatus::Invoking], EffectStatus::Completed)
                .with_result(json!({"echo": id})),
        );
        commit
            .events
            .push(NewEvent::new("tool.finished", json!({"effectId": id})).in_turn(&job.turn_id));
        match job.store.commit(commit).await {
            Ok(_) => Step::Next,
            Err(error) => store_failure(error),
        }
    }
}

async fn action(job: &TurnJob, id: &str) -> Step {
    let input = json!({"step": id});
    let mut begin = BeginEffect::new(
        &job.session.id,
        NewEffect::new(
            id,
            &job.turn_id,
            EffectKind::CapabilityCall,
            EffectStatus::Pending,
            json!({"capabilityId": ACTION_CAPABILITY, "input": input}),
        ),
    );
    begin.fence = Some(job.fence.clone());
    begin.action = Some(NewAction::new(
        &job.session.agent_id,
        &job.session.manifest_hash,
        &job.session.implementation_version,
        ACTION_CAPABILITY,
        json!({"input": input}),
    ));
    begin.events.push(
        NewEvent::new(
            "action.pending",
            json!({"actionId": id, "capabilityId": ACTION_CAPABILITY, "input": input}),
        )
        .in_turn(&job.turn_id),
    );
    let waiting = || {
        Step::End(TurnOutcome::Waiting {
            effect_ids: vec![id.to_owned()],
        })
    };
    match job.store.begin_effect(begin).await {
        Ok(BeginEffectOutcome::Started { .. }) => waiting(),
        Ok(BeginEffectOutcome::Existing(effect)) => match effect.status {
            EffectStatus::Completed => Step::Next,
            EffectStatus::Pending | EffectStatus::Invoking => waiting(),
            EffectStatus::Cancelled => {
                Step::End(failed("effect_cancelled", "an action was cancelled"))
            }
            _ => Step::End(TurnOutcome::Uncertain {
                effect_ids: vec![id.to_owned()],
            }),
        },
        Ok(_) => Step::End(failed("store_error", "unknown effect outcome")),
        Err(error) => store_failure(error),
    }
}

/// Pauses on an interaction: the checkpoint with it pending is written under the fence first,
/// as every turn engine must before it reports a pause.
async fn interaction(job: &TurnJob, id: &str, kind: &str) -> Step {
    if job.checkpoint.decisions.contains_key(id) {
        return Step::Next;
    }
    let arguments = json!({"code": format!("// step {id}")});
    let digest = Sha256::digest(canonical_json(&arguments).as_bytes());
    let mut checkpoint = job.checkpoint.clone();
    checkpoint.pending = vec![Interaction {
        interaction_id: id.to_owned(),
        kind: kind.to_owned(),
        tool_name: "run_js".to_owned(),
        capability_id: None,
        arguments,
        arguments_sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
    }];
    let data = match serde_json::to_value(&checkpoint) {
        Ok(data) => data,
        Err(error) => return Step::End(failed("internal_error", error.to_string())),
    };
    let mut commit = corral_store::SessionCommit::new(&job.session.id);
    commit.fence = Some(job.fence.clone());
    commit.checkpoint = Some(corral_store::CheckpointWrite::Put(
        corral_store::NewCheckpoint::new(&job.turn_id, job.segment, data),
    ));
    if let Err(error) = job.store.commit(commit).await {
        return store_failure(error);
    }
    Step::End(TurnOutcome::Paused { checkpoint })
}

async fn sleep(job: &TurnJob, duration: Duration) -> Step {
    tokio::select! {
        () = job.cancel.cancelled() => Step::End(TurnOutcome::Cancelled),
        () = tokio::time::sleep(duration) => Step::Next,
    }
}

async fn ticks(job: &TurnJob, n: u64) -> Step {
    for i in 0..n {
        if job.cancel.is_cancelled() {
            return Step::End(TurnOutcome::Cancelled);
        }
        let event = NewEvent::new("test.tick", json!({"i": i})).in_turn(&job.turn_id);
        if let Err(error) = job
            .store
            .append_event(&job.session.id, Some(&job.fence), event)
            .await
        {
            return store_failure(error);
        }
    }
    Step::Next
}
