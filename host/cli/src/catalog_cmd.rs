//! `corral catalog <typescript|prompt|check> FILE.json [--namespace NAME]` (`prompt` also
//! takes `--discovery-tokens N`): print what the model
//! would see of a catalog, or check it. Exit status: 0 on success, 1 for an invalid or
//! unrenderable catalog, 2 for an unreadable file.

use std::path::Path;
use std::process::ExitCode;

use corral_catalog::{Catalog, check_renderable, render_prompt_within, render_typescript};

/// What `corral catalog` does with the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogAction {
    /// Print the TypeScript declarations.
    Typescript,
    /// Print the `run_js` prompt within this discovery budget, and its approximate token count
    /// on stderr.
    Prompt(u32),
    /// Print `ok: N capabilities`, or every error on stderr.
    Check,
}

/// `corral catalog <typescript|prompt|check> FILE.json [--namespace NAME]`
pub fn run(action: CatalogAction, file: &Path, namespace: Option<&str>) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("corral catalog: cannot read {}: {error}", file.display());
            return ExitCode::from(2);
        }
    };
    let fail = |errors: Vec<String>| {
        for error in errors {
            eprintln!("{}: {error}", file.display());
        }
        ExitCode::from(1)
    };
    let catalog = match Catalog::from_any_json_str_all_errors(&text, namespace) {
        Ok(catalog) => catalog,
        Err(errors) => return fail(errors.iter().map(ToString::to_string).collect()),
    };
    let output = match action {
        CatalogAction::Typescript => render_typescript(&catalog),
        CatalogAction::Prompt(discovery_tokens) => render_prompt_within(&catalog, discovery_tokens)
            .map(|prompt| {
                let form = if prompt.discovery {
                    " (discovery form)"
                } else {
                    ""
                };
                eprintln!("approximately {} tokens{form}", prompt.approx_tokens);
                prompt.text
            }),
        // A catalog the model cannot be shown is not usable, so `check` renders it too.
        CatalogAction::Check => {
            let errors = check_renderable(&catalog);
            if !errors.is_empty() {
                return fail(errors.iter().map(ToString::to_string).collect());
            }
            Ok(format!("ok: {} capabilities\n", catalog.len()))
        }
    };
    match output {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(error) => fail(vec![error.to_string()]),
    }
}
