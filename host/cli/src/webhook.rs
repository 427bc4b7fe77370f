//! The webhook backend of `corral exec` and `corral chat` (it lives in `corral-chat`, where the
//! server uses it too).

pub use corral_chat::backends::WebhookBackend;
