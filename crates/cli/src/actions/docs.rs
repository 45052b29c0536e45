//! `sealdisk completions SHELL` and `sealdisk man`: shell completions and man pages made
//! from the same clap definitions that parse the command line, so they never drift.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Command};
use clap_complete::Shell;

/// Arguments of `completions`.
#[derive(Debug, Args)]
#[command(after_help = "\
Install (bash):  sealdisk completions bash > /usr/share/bash-completion/completions/sealdisk
Install (zsh):   sealdisk completions zsh > /usr/local/share/zsh/site-functions/_sealdisk
Install (fish):  sealdisk completions fish > ~/.config/fish/completions/sealdisk.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Arguments of `man`.
#[derive(Debug, Args)]
#[command(after_help = "\
Read:     sealdisk man | man -l -
Install:  sealdisk man --out-dir /usr/local/share/man/man1")]
pub struct ManArgs {
    /// Write sealdisk.1 and one page per command (sealdisk-luksFormat.1, ...) into DIR
    /// instead of printing the main page.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Prints the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs, mut cmd: Command) -> Result<()> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "sealdisk", &mut out);
    out.flush().context("writing the completion script")
}

/// Prints the main man page, or writes every page into `--out-dir`.
pub fn man(a: ManArgs, cmd: Command) -> Result<()> {
    match a.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages to {}", dir.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out).context("writing the man page")?;
            out.flush().context("writing the man page")
        }
    }
}
