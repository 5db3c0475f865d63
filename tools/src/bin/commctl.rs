//! commctl: the starwire command-line tool.
use argh::FromArgs;

/// commctl: inspect and exercise starwire tasks.
#[derive(FromArgs)]
struct Commctl {
    /// print the version and exit
    #[argh(switch, short = 'V')]
    version: bool,
}

fn main() {
    let args: Commctl = argh::from_env();
    if args.version {
        println!("commctl {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    eprintln!("commctl: no subcommand given (try --help)");
    std::process::exit(2);
}
