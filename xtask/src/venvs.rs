//! The Python venvs the end-to-end tests need, built while the workspace compiles: pip
//! spends its time downloading and unpacking (the LiteLLM proxy, ~100 s on its own), so
//! it overlaps the build instead of adding to the tests. Each venv is built beside its
//! path and renamed into place, as `test_support::pyvenv` builds and finds them; one
//! that cannot be built here is left to its test, which says why.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// (venv name under the temp dir, pip requirements, import check): the same as the
/// tests that use them (tests/gateway_litellm.rs: `VENV`, `LITELLM`).
const VENVS: &[(&str, &str, &str)] = &[(
    "tokenscope-litellm-venv",
    "litellm[proxy]==1.108.7",
    "import litellm",
)];

pub(crate) struct Prebuild {
    jobs: Vec<(&'static str, Child, PathBuf)>,
}

/// Starts building every venv that does not work yet, in the background.
pub(crate) fn start() -> Prebuild {
    let tmp = std::env::temp_dir();
    let mut jobs = Vec::new();
    for &(name, packages, check) in VENVS {
        let venv = tmp.join(name);
        let log = tmp.join(format!("{name}.xtask.log"));
        let script = format!(
            "set -e\n\
             v='{venv}'\n\
             if \"$v/bin/python\" -c '{check}' 2>/dev/null; then exit 0; fi\n\
             b=\"$v.xtask$$\"\n\
             python3 -m venv --clear \"$b\"\n\
             \"$b/bin/python\" -m pip install --quiet --disable-pip-version-check --no-compile {packages}\n\
             rm -rf \"$v\"\n\
             mv \"$b\" \"$v\"\n",
            venv = venv.display(),
            packages = packages
                .split_whitespace()
                .map(|p| format!("'{p}'"))
                .collect::<Vec<_>>()
                .join(" "),
        );
        let spawned = std::fs::File::create(&log).and_then(|out| {
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
        });
        match spawned {
            Ok(child) => jobs.push((name, child, log)),
            Err(e) => eprintln!("xtask: warning: could not start building the {name} venv: {e}"),
        }
    }
    Prebuild { jobs }
}

impl Prebuild {
    /// Waits for the builds; a failed one is reported (its test will try again).
    pub(crate) fn finish(self) {
        for (name, mut child, log) in self.jobs {
            match child.wait() {
                Ok(s) if s.success() => {}
                other => eprintln!(
                    "xtask: warning: building the {name} venv failed ({other:?}); see {}",
                    log.display()
                ),
            }
        }
    }
}
