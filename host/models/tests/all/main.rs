//! corral-models' integration tests, in one binary: the HTTP adapters against recorded wire
//! fixtures (`adapters`), and the scripted model with provider configuration (`scripted`).

mod adapters;
mod scripted;
mod support;
