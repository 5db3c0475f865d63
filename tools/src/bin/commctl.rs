//! commctl: the starwire command-line tool. See `commctl --help`.

use std::io::Write;

fn main() {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect::<Result<_, _>>()
    {
        Ok(args) => args,
        Err(bad) => {
            // Never a panic, also when stderr is closed.
            let _ = writeln!(
                std::io::stderr(),
                "commctl: argument {:?} is not valid UTF-8",
                bad.to_string_lossy()
            );
            std::process::exit(starwire_tools::exit::USAGE);
        }
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    std::process::exit(starwire_tools::run(&args));
}
