//! The numbered migration files of both backends, compiled into the binary.

/// One migration file.
#[derive(Debug)]
pub(crate) struct Migration {
    /// Its number: migrations apply in increasing order, each exactly once.
    pub(crate) version: u32,
    /// Its file name under `migrations/<backend>/`.
    pub(crate) name: &'static str,
    /// Its SQL.
    pub(crate) sql: &'static str,
}

macro_rules! migrations {
    ($backend:literal: $($version:literal => $name:literal),+ $(,)?) => {
        &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../migrations/", $backend, "/", $name)),
        }),+]
    };
}

/// Migrations of the embedded store.
pub(crate) const SQLITE: &[Migration] = migrations!("sqlite": 1 => "0001_initial.sql", 2 => "0002_agent_access.sql", 3 => "0003_effects_by_turn.sql", 4 => "0004_fewer_pages_per_commit.sql");

/// Migrations of PostgreSQL.
pub(crate) const POSTGRES: &[Migration] = migrations!("postgres": 1 => "0001_initial.sql", 2 => "0002_agent_access.sql", 3 => "0003_effects_by_turn.sql", 4 => "0004_fewer_pages_per_commit.sql");

/// The newest version in `migrations`.
pub(crate) fn latest(migrations: &[Migration]) -> u32 {
    migrations.last().map_or(0, |migration| migration.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file in the folder is listed, in order, numbered 1, 2, 3... by its name, so a new
    /// file cannot be forgotten or applied out of order.
    fn check(backend: &str, listed: &[Migration]) {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(backend);
        let mut files: Vec<String> = std::fs::read_dir(&folder)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok())
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let names: Vec<&str> = listed.iter().map(|migration| migration.name).collect();
        assert_eq!(files, names, "migrations/{backend} and the list disagree");
        for (index, migration) in listed.iter().enumerate() {
            assert_eq!(migration.version as usize, index + 1);
            assert!(
                migration
                    .name
                    .starts_with(&format!("{:04}_", migration.version)),
                "{} is not numbered {}",
                migration.name,
                migration.version
            );
        }
    }

    #[test]
    fn sqlite_migrations_match_their_folder() {
        check("sqlite", SQLITE);
    }

    #[test]
    fn postgres_migrations_match_their_folder() {
        check("postgres", POSTGRES);
    }

    #[test]
    fn both_backends_reach_the_same_schema_version() {
        assert_eq!(latest(SQLITE), latest(POSTGRES));
    }
}
