//! corral's addition: several prepared statements sent in one write with one `Sync` at the end
//! (`../CORRAL.md`).
//!
//! `Client::execute` and `Client::query` end every statement with its own `Sync`, so a client
//! that pipelines N statements makes the server answer and flush N times. Here the server runs
//! the statements in order, answers them all, and flushes once, at the `Sync`. As in libpq's
//! pipeline mode, the first error makes the server skip every statement after it up to the
//! `Sync`.

use crate::client::InnerClient;
use crate::codec::FrontendMessage;
use crate::connection::RequestMessages;
use crate::types::ToSql;
use crate::{Error, Row, Statement, query, slice_iter};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;

/// What one statement of a pipeline returned: its rows and the number of rows it affected.
#[derive(Debug)]
pub struct Pipelined {
    /// The rows the statement returned (none for a statement without rows).
    pub rows: Vec<Row>,
    /// The row count of the statement's command tag (0 when it has none).
    pub affected: u64,
}

/// Why a pipeline failed: the error, and the index of the statement it belongs to (the number
/// of statements when it came after the last one).
#[derive(Debug)]
pub struct PipelineError {
    /// The index of the statement that failed; the statements before it ran.
    pub index: usize,
    /// The error.
    pub error: Error,
}

type Item<'a> = (&'a Statement, &'a [&'a (dyn ToSql + Sync)]);

pub(crate) async fn pipeline(
    client: &InnerClient,
    statements: &[Item<'_>],
) -> Result<Vec<Pipelined>, PipelineError> {
    let failed = |index| move |error| PipelineError { index, error };
    let buf = client
        .with_buf(|buf| {
            for (statement, params) in statements {
                query::encode_bind(statement, slice_iter(params), "", buf)?;
                frontend::execute("", 0, buf).map_err(Error::encode)?;
            }
            frontend::sync(buf);
            Ok(buf.split().freeze())
        })
        .map_err(failed(0))?;
    let mut responses = client
        .send(RequestMessages::Single(FrontendMessage::Raw(buf)))
        .map_err(failed(0))?;
    let mut results = Vec::with_capacity(statements.len());
    for (index, (statement, _)) in statements.iter().enumerate() {
        let unexpected = || PipelineError {
            index,
            error: Error::unexpected_message(),
        };
        match responses.next().await.map_err(failed(index))? {
            Message::BindComplete => {}
            _ => return Err(unexpected()),
        }
        let mut rows = Vec::new();
        let affected = loop {
            match responses.next().await.map_err(failed(index))? {
                Message::DataRow(body) => {
                    rows.push(Row::new((*statement).clone(), body).map_err(failed(index))?)
                }
                Message::CommandComplete(body) => {
                    break query::extract_row_affected(&body).map_err(failed(index))?;
                }
                Message::EmptyQueryResponse => break 0,
                _ => return Err(unexpected()),
            }
        };
        results.push(Pipelined { rows, affected });
    }
    let end = statements.len();
    match responses.next().await.map_err(failed(end))? {
        Message::ReadyForQuery(_) => Ok(results),
        _ => Err(PipelineError {
            index: end,
            error: Error::unexpected_message(),
        }),
    }
}
