//! `corroborate` and `max_off_watts`: a default threshold, a checked one, and a clear error
//! naming the key for a typo, a value out of range, or a threshold without a witness.

use std::path::Path;

use crate::config::Config;
use crate::decision::{OffWitness, Watts};

fn parse(protocol: &str, extra: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "s3cret-value\n").unwrap();
    let address = if protocol == "ipmi" {
        "{node}-bmc.dc1.example"
    } else {
        "https://{node}-bmc.dc1.example"
    };
    let text = format!(
        "datacenter = \"dc1\"\n[[bmc]]\nnodes = [\"n-*\"]\nprotocol = \"{protocol}\"\n\
         address = \"{address}\"\nusername = \"fence\"\npassword_file = \"{}\"\n{extra}",
        pw.display()
    );
    Config::parse(&text, Path::new("dc1.toml")).map_err(|e| e.to_string())
}

fn witness(protocol: &str, extra: &str) -> Option<OffWitness> {
    parse(protocol, extra)
        .unwrap_or_else(|e| panic!("{extra}: {e}"))
        .bmc[0]
        .corroborate
}

#[test]
fn power_draw_has_a_default_threshold_and_takes_one() {
    for protocol in ["redfish", "ipmi"] {
        assert_eq!(witness(protocol, ""), None);
        assert_eq!(
            witness(protocol, "corroborate = \"power-draw\"\n"),
            Some(OffWitness::PowerDraw {
                max_off_watts: Watts::whole(crate::config::bmc::DEFAULT_MAX_OFF_WATTS)
            })
        );
        for (value, watts) in [("0", 0.0), ("35", 35.0), ("12.5", 12.5), ("500", 500.0)] {
            assert_eq!(
                witness(
                    protocol,
                    &format!("corroborate = \"power-draw\"\nmax_off_watts = {value}\n")
                ),
                Some(OffWitness::PowerDraw {
                    max_off_watts: Watts::from_f64(watts).unwrap()
                }),
                "{value}"
            );
        }
    }
}

#[test]
fn a_typo_or_a_value_out_of_range_is_an_error_naming_the_key() {
    let err = |extra: &str| parse("redfish", extra).unwrap_err();
    let e = err("corroborate = \"power_draw\"\n");
    assert!(
        e.contains("[[bmc]] #1 corroborate: ") && e.contains("\"power_draw\" is not a witness"),
        "{e}"
    );
    assert!(e.contains("use \"power-draw\""), "{e}");
    for value in ["-1", "500.5", "1e9", "nan"] {
        let e = err(&format!(
            "corroborate = \"power-draw\"\nmax_off_watts = {value}\n"
        ));
        assert!(
            e.contains("[[bmc]] #1 max_off_watts: ") && e.contains("out of range"),
            "{value}: {e}"
        );
    }
    let e = err("max_off_watts = 20\n");
    assert!(
        e.contains("[[bmc]] #1 max_off_watts: ")
            && e.contains("applies with corroborate = \"power-draw\" only"),
        "{e}"
    );
    let e = err("corroborate = \"power-draw\"\nmax_off_watt = 20\n");
    assert!(e.contains("max_off_watt"), "{e}");
    let e = err("corroborate = \"power-draw\"\nmax_off_watts = \"20 W\"\n");
    assert!(e.contains("max_off_watts"), "{e}");
}
