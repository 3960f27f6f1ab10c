//! Promoted skills in the agent loop: each is a tool `skill__<name>` (a prompt skill answers its text and runs without asking; a script skill runs its commands as one bash call, asking like bash).

use crate::host::skills::{Skill, SkillKind};
use crate::provider::ToolDef;
use crate::session::runtime::Runtime;
use crate::tools::{self, ToolClass, ToolOutput};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// A skill tool's name prefix.
pub(crate) const PREFIX: &str = crate::provider::SKILL_TOOL_PREFIX;
/// The longest `arguments` a skill call takes, in bytes.
const MAX_ARGUMENTS: usize = 16 * 1024;

/// The skills promoted for the runtime's workspace (a leg reads them when it starts).
pub(crate) async fn load(rt: &Runtime) -> Vec<Skill> {
    let (skills, ws) = (rt.skills().clone(), rt.cfg.workspace.clone());
    match tokio::task::spawn_blocking(move || skills.list(&ws)).await {
        Ok(Ok(list)) => list,
        Ok(Err(e)) => {
            tracing::warn!("cannot read the promoted skills: {}", e.message);
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// Each skill as the model sees it.
pub(crate) fn defs(skills: &[Skill]) -> Vec<ToolDef> {
    skills
        .iter()
        .map(|s| ToolDef {
            name: format!("{PREFIX}{}", s.name),
            description: match s.kind {
                SkillKind::Prompt => format!(
                    "A learned skill: answers its instructions, which you then follow. {}",
                    s.description
                ),
                SkillKind::Script => format!("A learned skill: runs its shell commands in the workspace. {}", s.description),
            },
            input_schema: json!({
                "type": "object",
                "properties": {"arguments": {"type": "string", "description": "What this use of the skill is about (optional)"}},
                "additionalProperties": false
            }),
        })
        .collect()
}

/// What the system prompt says of the skills' slash commands (nothing when
/// there are none): a person types `/NAME ARGUMENTS` in a client to use one.
pub(crate) fn system_note(skills: &[Skill]) -> &'static str {
    match skills.is_empty() {
        true => "",
        false => {
            "\nA user line `/NAME ARGUMENTS` where you have a tool `skill__NAME` asks you to call that tool \
with {\"arguments\": \"ARGUMENTS\"} (no arguments: {}), then to carry on from its result.\n"
        }
    }
}

fn find<'a>(tool: &str, skills: &'a [Skill]) -> Option<&'a Skill> {
    let name = tool.strip_prefix(PREFIX)?;
    skills.iter().find(|s| s.name == name)
}

/// A skill tool's class: a prompt reads, a script runs programs.
pub(crate) fn class(tool: &str, skills: &[Skill]) -> Option<ToolClass> {
    find(tool, skills).map(|s| match s.kind {
        SkillKind::Prompt => ToolClass::Read,
        SkillKind::Script => ToolClass::Exec,
    })
}

/// Carries out a skill call; None when `tool` is no skill of this leg.
pub(crate) async fn run(
    rt: &Runtime,
    tool: &str,
    skills: &[Skill],
    input: &Value,
    cancel: &CancellationToken,
    live: Option<&tools::Live>,
) -> Option<ToolOutput> {
    let skill = find(tool, skills)?;
    let arguments = input.get("arguments").and_then(Value::as_str).unwrap_or_default();
    if arguments.len() > MAX_ARGUMENTS {
        return Some(ToolOutput {
            ok: false,
            output: format!(
                "`arguments` is {} bytes; at most {MAX_ARGUMENTS}",
                arguments.len()
            ),
            exit_code: None,
        });
    }
    Some(match skill.kind {
        SkillKind::Prompt => {
            let mut text = format!("skill {}:\n{}", skill.name, skill.body);
            if !arguments.is_empty() {
                text.push_str(&format!("\n\narguments: {arguments}"));
            }
            ToolOutput {
                ok: true,
                output: text,
                exit_code: None,
            }
        }
        SkillKind::Script => {
            let input = json!({ "command": skill.body });
            tools::run_live(&rt.cfg.workspace, rt.sandbox(), "bash", &input, cancel, live).await
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::skills::Scope;

    #[test]
    fn the_system_prompt_explains_slash_commands_only_when_there_are_skills() {
        assert_eq!(system_note(&[]), "");
        let skill = Skill {
            name: "fmt-check".into(),
            description: "runs: cargo fmt --check".into(),
            kind: SkillKind::Script,
            body: "cargo fmt --check".into(),
            scope: Scope::Workspace,
            path: "/w/.vak/skills/fmt-check.md".into(),
        };
        let note = system_note(std::slice::from_ref(&skill));
        assert!(
            note.contains("`/NAME ARGUMENTS`") && note.contains("`skill__NAME`"),
            "{note}"
        );
        assert_eq!(defs(&[skill])[0].name, "skill__fmt-check");
    }
}
