use std::process::ExitCode;

fn main() -> ExitCode {
    oobfence::cli::main()
}
