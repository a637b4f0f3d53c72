//! `plexus-componentize CORE.wasm COMPONENT.wasm`: turns a wasm32-wasip1 core module built with the
//! plexus SDK into a component (WASI preview1 calls adapted to preview2 by the reactor adapter).

use std::process::ExitCode;

fn run(input: &str, output: &str) -> Result<(), String> {
    let core = std::fs::read(input).map_err(|e| format!("cannot read {input}: {e}"))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&core)
        .and_then(|enc| {
            enc.adapter(
                "wasi_snapshot_preview1",
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .and_then(|enc| enc.validate(true).encode())
        .map_err(|e| format!("cannot componentize {input}: {e:#}"))?;
    let tmp = format!("{output}.tmp");
    std::fs::write(&tmp, &component).map_err(|e| format!("cannot write {tmp}: {e}"))?;
    std::fs::rename(&tmp, output).map_err(|e| format!("cannot write {output}: {e}"))?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: plexus-componentize CORE.wasm COMPONENT.wasm");
        return ExitCode::from(2);
    };
    match run(input, output) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexus-componentize: {e}");
            ExitCode::FAILURE
        }
    }
}
