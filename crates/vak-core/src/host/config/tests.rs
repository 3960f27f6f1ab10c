//! Unit tests of config.toml reading, route resolution and the settings.

use super::*;

fn layer(p: Option<ProviderKind>, m: Option<&str>, u: Option<&str>) -> RouteLayer {
    RouteLayer {
        provider: p,
        model: m.map(Into::into),
        base_url: u.map(Into::into),
    }
}

#[test]
fn flags_win_over_the_environment_over_the_file_over_the_default() {
    let none = RouteLayer::default();
    assert_eq!(resolve_spec(&none, &none, &none).unwrap(), RouteSpec::offline());
    let file = layer(
        Some(ProviderKind::OpenAi),
        Some("gpt-file"),
        Some("http://127.0.0.1:9/v1"),
    );
    let s = resolve_spec(&none, &none, &file).unwrap();
    assert_eq!(
        (s.provider, s.model.as_str(), s.source),
        (ProviderKind::OpenAi, "gpt-file", Source::File)
    );
    // A model flag alone keeps the file's provider and base URL.
    let s = resolve_spec(&layer(None, Some("gpt-flag"), None), &none, &file).unwrap();
    assert_eq!((s.model.as_str(), s.source), ("gpt-flag", Source::Flag));
    assert_eq!(s.base_url.as_deref(), Some("http://127.0.0.1:9/v1"));
    // Another provider from the environment drops the file's model and URL.
    let env = layer(Some(ProviderKind::Anthropic), Some("claude-x"), None);
    let s = resolve_spec(&none, &env, &file).unwrap();
    assert_eq!(
        (s.provider, s.model.as_str(), s.base_url, s.source),
        (ProviderKind::Anthropic, "claude-x", None, Source::Env)
    );
    let e = resolve_spec(&layer(Some(ProviderKind::Anthropic), None, None), &none, &file).unwrap_err();
    assert!(e.message.contains("needs a model"), "{e}");
}

#[test]
fn config_toml_ignores_unimplemented_sections_and_refuses_typos_in_known_ones() {
    let f = FileConfig::parse(
        "[server]\ntrusted_hosts = [\"a\"]\n[model]\nprovider = \"openai\"\nmodel = \"m\"\n[finops]\nmax_day_usd = 3\n[mcp.servers.x]\ncommand = \"y\"\n[skills]\nx = 1\n",
    )
    .unwrap();
    assert_eq!(f.ignored, vec!["skills".to_string()]);
    assert_eq!(f.finops.max_day_usd, Some(3.0));
    assert_eq!(f.mcp["x"].command.as_deref(), Some("y"));
    assert_eq!(f.model.provider, Some(ProviderKind::OpenAi));
    let e = FileConfig::parse("[model]\nmodle = \"x\"\n").unwrap_err();
    assert!(e.contains("line 2") && e.contains("modle"), "{e}");
    let e = FileConfig::parse("[model]\nprovider = \"gemini\"\n").unwrap_err();
    assert!(e.contains("unknown provider"), "{e}");
}

#[test]
fn the_terminal_is_off_and_loopback_only_unless_said_otherwise() {
    let f = FileConfig::parse("").unwrap();
    assert_eq!(f.server.web, FileWeb::default());
    assert!(!f.server.web.terminal && f.server.web.terminal_requires_loopback);
    let f = FileConfig::parse("[server.web]\nterminal = true\n").unwrap();
    assert!(f.server.web.terminal && f.server.web.terminal_requires_loopback);
    let e =
        FileConfig::parse("[server.web]\nterminal = true\nterminl_requires_loopback = false\n").unwrap_err();
    assert!(
        e.contains("line 3") && e.contains("terminl_requires_loopback"),
        "{e}"
    );
}

#[test]
fn persisting_keeps_comments_and_other_sections() {
    let home = tempfile::tempdir().unwrap();
    let text = "# mine\n[server]\ntrusted_hosts = [\"h\"] # keep\n\n[model]\n# the model\nprovider = \"offline\" # which\nbase_url = \"http://x\"\n";
    std::fs::write(config_path(home.path()), text).unwrap();
    let spec = RouteSpec {
        provider: ProviderKind::OpenAi,
        model: "gpt-x".into(),
        base_url: None,
        source: Source::Api,
    };
    persist(home.path(), Some(&spec), &SettingsPatch::default()).unwrap();
    let out = std::fs::read_to_string(config_path(home.path())).unwrap();
    assert!(
        out.contains("# mine")
            && out.contains("# keep")
            && out.contains("# the model")
            && out.contains("# which"),
        "{out}"
    );
    assert!(
        out.contains("provider = \"openai\"") && out.contains("model = \"gpt-x\""),
        "{out}"
    );
    assert!(!out.contains("base_url"), "{out}");
    let f = FileConfig::parse(&out).unwrap();
    assert_eq!(f.model.model.as_deref(), Some("gpt-x"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(config_path(home.path()))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}
