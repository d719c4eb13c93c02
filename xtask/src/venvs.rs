//! The Python venvs the end-to-end tests need, built while the workspace compiles: pip
//! spends its time downloading and unpacking (the LiteLLM proxy ~100 s, every API's SDK
//! ~30 s), so it overlaps the build instead of adding to the tests. One after another in
//! one background job, each built beside its path and renamed into place as
//! `test_support::pyvenv` builds and finds them; one that cannot be built here is left
//! to its test, which says why.

use std::process::{Child, Command, Stdio};

#[path = "../../test-support/src/venv_specs.rs"]
#[allow(dead_code, unreachable_pub)] // test-support's constants, read here as they are
mod venv_specs;

pub(crate) struct Prebuild {
    job: Option<(Child, std::path::PathBuf)>,
}

/// Starts building, in the background, every venv that does not work yet.
pub(crate) fn start() -> Prebuild {
    let tmp = std::env::temp_dir();
    let log = tmp.join("tokenscope-venvs.xtask.log");
    let spawned = std::fs::File::create(&log).and_then(|out| {
        Command::new("sh")
            .arg("-c")
            .arg(script(&tmp))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
    });
    match spawned {
        Ok(child) => Prebuild {
            job: Some((child, log)),
        },
        Err(e) => {
            eprintln!("xtask: warning: could not start building the tests' venvs: {e}");
            Prebuild { job: None }
        }
    }
}

/// The shell script that builds every venv missing under `tmp`, one after another.
fn script(tmp: &std::path::Path) -> String {
    let mut script = String::from("status=0\n");
    for (name, packages, check) in venv_specs::ALL {
        let quoted: Vec<String> = packages
            .split_whitespace()
            .map(|p| format!("'{p}'"))
            .collect();
        script += &format!(
            "v='{venv}'\n\
             if ! \"$v/bin/python\" -c \"{check}\" 2>/dev/null; then\n\
             \x20 b=\"$v.xtask$$\"\n\
             \x20 echo \"building $v\"\n\
             \x20 if python3 -m venv --clear \"$b\" && \"$b/bin/python\" -m pip install --quiet \
             --disable-pip-version-check --no-compile {packages}; then\n\
             \x20   rm -rf \"$v\" && mv \"$b\" \"$v\"\n\
             \x20 else\n\
             \x20   echo \"failed: $v\"; status=1\n\
             \x20 fi\n\
             fi\n",
            venv = tmp.join(name).display(),
            packages = quoted.join(" "),
        );
    }
    script += "exit $status\n";
    script
}

impl Prebuild {
    /// Waits for the builds; a failure is reported (each test will try again).
    pub(crate) fn finish(self) {
        let Some((mut child, log)) = self.job else {
            return;
        };
        match child.wait() {
            Ok(s) if s.success() => {}
            other => eprintln!(
                "xtask: warning: building the tests' venvs failed ({other:?}); see {}",
                log.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_venv_script_is_valid_shell_naming_every_venv() {
        let text = super::script(std::path::Path::new("/tmp"));
        for (name, packages, _) in super::venv_specs::ALL {
            assert!(text.contains(&format!("v='/tmp/{name}'")), "{name}");
            assert!(text.contains(packages.split_whitespace().next().unwrap()));
        }
        let checked = std::process::Command::new("sh")
            .args(["-n", "-c", &text])
            .status()
            .expect("sh");
        assert!(checked.success(), "sh -n rejects:\n{text}");
    }
}
