use super::*;

fn run(session: &str, ws: &Path, calls: &[&str]) -> RunShape {
    RunShape {
        session: session.into(),
        workspace: ws.display().to_string(),
        prompts: vec![(2, "/bash ...".into())],
        calls: calls
            .iter()
            .enumerate()
            .map(|(n, c)| (n as u64 + 3, "bash".to_string(), c.to_string()))
            .collect(),
    }
}

#[test]
fn a_tool_sequence_run_twice_is_proposed_once_and_promoted_as_a_file() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let skills = Skills::open(home.path(), false);
    let seq = ["cargo fmt --check", "cargo test -q"];
    assert!(
        skills.observe(&run("a", ws.path(), &seq)).is_none(),
        "the first time is not a pattern"
    );
    assert!(
        skills.observe(&run("a", ws.path(), &["cargo test -q"])).is_none(),
        "another shape"
    );
    let p = skills
        .observe(&run("b", ws.path(), &seq))
        .expect("the second time is proposed");
    assert_eq!(p.kind, SkillKind::Script);
    assert_eq!(p.body, "cargo fmt --check\ncargo test -q");
    assert_eq!(p.name, "cargo-fmt-check");
    assert_eq!(p.source.session, "b");
    assert!(
        skills.observe(&run("c", ws.path(), &seq)).is_none(),
        "once per shape"
    );
    let other = tempfile::tempdir().unwrap();
    assert!(
        skills.observe(&run("d", other.path(), &seq)).is_none(),
        "runs of another workspace are not matched"
    );
    let s = skills.promote(&p.id, Scope::Workspace, Some("check")).unwrap();
    assert_eq!(s.path, ws.path().join(".vak/skills/check.md"));
    let listed = skills.list(ws.path()).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].kind, listed[0].body.as_str()),
        ("check", SkillKind::Script, p.body.as_str())
    );
    let again = skills.promote(&p.id, Scope::Workspace, None).unwrap_err();
    assert_eq!(again.reason, Some("proposal_settled"));
    // A near-copy of a promoted skill is tagged as one.
    let near = skills
        .propose(
            &run("e", ws.path(), &["cargo fmt --check", "cargo test -q --all"]),
            None,
        )
        .unwrap();
    assert_eq!(near.duplicate_of.as_deref(), Some("check"), "{near:?}");
    assert_eq!(near.tags, ["duplicate-of:check"]);
    // The name is taken: a second promote under it is refused, nothing overwritten.
    let taken = skills
        .promote(&near.id, Scope::Workspace, Some("check"))
        .unwrap_err();
    assert_eq!(taken.reason, Some("skill_exists"));
    let far = skills
        .propose(&run("f", ws.path(), &["ls docs"]), Some("list-docs"))
        .unwrap();
    assert_eq!(far.duplicate_of, None);
    assert_eq!(skills.reject(&far.id).unwrap().state, ProposalState::Rejected);
    assert!(skills
        .propose(&run("g", ws.path(), &[]), Some("Bad Name"))
        .is_err());
}

#[test]
fn a_prompt_run_twice_is_a_prompt_skill_and_the_similarity_rule_is_word_overlap() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let skills = Skills::open(home.path(), false);
    let shape = |s: &str| RunShape {
        session: s.into(),
        workspace: ws.path().display().to_string(),
        prompts: vec![(1, "summarise the open issues".into())],
        calls: Vec::new(),
    };
    assert!(skills.observe(&shape("a")).is_none());
    let p = skills.observe(&shape("b")).unwrap();
    assert_eq!(
        (p.kind, p.name.as_str()),
        (SkillKind::Prompt, "summarise-the-open-issues")
    );
    assert!((similarity("a b c d", "a b c d e") - 0.8).abs() < 1e-9);
    assert_eq!(similarity("", ""), 1.0);
    assert_eq!(similarity("x", "y"), 0.0);
}

#[test]
fn skill_files_round_trip_and_hostile_ones_are_skipped() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let d = ws.path().join(".vak/skills");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("no-front-matter.md"), "just text").unwrap();
    std::fs::write(d.join("bad-kind.md"), "---\nname: x\nkind: rocket\n---\nbody\n").unwrap();
    std::fs::write(
        d.join("big.md"),
        format!("---\nname: big\nkind: prompt\n---\n{}", "x".repeat(70_000)),
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", d.join("link.md")).unwrap();
    std::fs::write(
        d.join("ok.md"),
        "---\nname: ok\ndescription: fine\nkind: prompt\n---\nsay hi\n",
    )
    .unwrap();
    std::fs::create_dir_all(home.path().join("skills")).unwrap();
    std::fs::write(
        home.path().join("skills/ok.md"),
        "---\nname: ok\nkind: script\n---\necho global\n",
    )
    .unwrap();
    std::fs::write(
        home.path().join("skills/g.md"),
        "---\nname: g\nkind: script\n---\necho g\n",
    )
    .unwrap();
    let listed = list(home.path(), ws.path()).unwrap();
    let names: Vec<(&str, Scope)> = listed.iter().map(|s| (s.name.as_str(), s.scope)).collect();
    assert_eq!(
        names,
        [("ok", Scope::Workspace), ("g", Scope::Global)],
        "the workspace's wins a shared name"
    );
    assert_eq!(listed[0].body, "say hi");
}

#[test]
fn a_symlinked_skills_folder_is_neither_read_nor_written_through() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("x.md"),
        "---\nname: x\nkind: prompt\n---\nhi\n",
    )
    .unwrap();
    std::fs::create_dir(ws.path().join(".vak")).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join(".vak/skills")).unwrap();
    assert!(
        list(home.path(), ws.path()).unwrap().is_empty(),
        "not read through the symlink"
    );
    let skills = Skills::open(home.path(), false);
    let p = skills
        .propose(&run("a", ws.path(), &["echo hi"]), Some("echo-hi"))
        .unwrap();
    let e = skills.promote(&p.id, Scope::Workspace, None).unwrap_err();
    assert!(e.message.contains("cannot write the skill"), "{e:?}");
    assert!(
        !outside.path().join("echo-hi.md").exists(),
        "nothing written outside the workspace"
    );
}
