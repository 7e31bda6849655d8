//! Power source entries: `[[bmc]]` (Redfish, IPMI and its defaults) and `[aws]`, which nodes
//! each maps, two entries for one machine refused, and the identity check.

use super::*;

#[test]
fn aws_section_maps_nodes_after_bmc_entries() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n[aws]\nregion = \"us-east-1\"\nnodes = [\"*\"]\nendpoint_url = \"http://127.0.0.1:5000\"\n",
        minimal(&write_pw(dir.path()))
    );
    let cfg = parse(&text).unwrap();
    assert!(matches!(cfg.mapping_for("rack1-01"), Some(Mapping::Bmc(_))));
    assert!(matches!(
        cfg.mapping_for("ip-10-0-0-1"),
        Some(Mapping::Aws(_))
    ));
    let aws = cfg.aws.as_ref().unwrap();
    assert_eq!(aws.timeout, Duration::from_secs(10));
    assert_eq!(aws.volume_release_warning, Duration::from_secs(600));
    let bad = text.replace("us-east-1", "US East");
    assert!(parse(&bad).unwrap_err().to_string().contains("aws.region"));
    let bad = text.replace("http://127.0.0.1:5000", "ftp://x");
    assert!(
        parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("aws.endpoint_url")
    );
}

#[test]
fn ipmi_entries_get_defaults_and_keep_to_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let ipmi = minimal(&pw)
        .replace("\"redfish\"", "\"ipmi\"")
        .replace("https://{node}-bmc.dc1.example", "{node}-ipmi.dc1.example");
    let cfg = parse(&ipmi).unwrap();
    let b = cfg.bmc_for("rack1-07").unwrap();
    assert_eq!(b.protocol, Protocol::Ipmi);
    assert_eq!(b.ipmi, Some(ipmi::IpmiOptions::default()));
    assert_eq!(b.address_for("rack1-07"), "rack1-07-ipmi.dc1.example");
    assert_eq!(b.timeout, Duration::from_secs(5));
    // Suite 17 as User by default; 3, or 17 then 3, and the other roles when asked for.
    let options = |extra: &str| parse(&format!("{ipmi}{extra}")).map(|c| c.bmc[0].ipmi.unwrap());
    let default = options("").unwrap();
    assert_eq!(default.cipher_suites.to_string(), "17");
    assert_eq!(default.privilege, ipmi::Privilege::User);
    assert_eq!(
        options("cipher_suite = 3\n")
            .unwrap()
            .cipher_suites
            .to_string(),
        "3"
    );
    let both = options("cipher_suite = [17, 3]\nprivilege = \"operator\"\n").unwrap();
    assert_eq!(both.cipher_suites.to_string(), "17, then 3");
    assert_eq!(both.cipher_suites.in_order().collect::<Vec<_>>(), [17, 3]);
    assert_eq!(both.privilege, ipmi::Privilege::Operator);
    for (extra, want) in [
        (
            "cipher_suite = 5\n",
            "cipher suite 5 is not spoken by oobfence: use 17",
        ),
        (
            "cipher_suite = 0\n",
            "cipher suite 0 has no integrity protection",
        ),
        ("cipher_suite = [17, 17]\n", "two different ones"),
        ("cipher_suite = [17, 3, 1]\n", "two different ones"),
        (
            "cipher_suite = [17, 2]\n",
            "cipher suite 2 has no encryption",
        ),
        ("cipher_suite = \"17\"\n", "bmc"),
        (
            "privilege = \"root\"\n",
            "\"root\" is not a privilege: use \"user\"",
        ),
    ] {
        let e = options(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    let e = parse(&format!("{ipmi}ca_file = \"/x\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[[bmc]] #1 ca_file: ") && e.contains("redfish"),
        "{e}"
    );
    let e = parse(&format!("{ipmi}cipher_suite = 300\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[[bmc]] #1 cipher_suite: "), "{e}");
    // Redfish entries refuse the IPMI keys.
    let e = parse(&format!("{}privilege = \"administrator\"\n", minimal(&pw)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[[bmc]] #1 privilege: ") && e.contains("\"ipmi\" only"),
        "{e}"
    );
    assert_eq!(parse(&minimal(&pw)).unwrap().bmc[0].ipmi, None);
}

#[test]
fn two_entries_for_one_machine_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let entry = |node: &str, system: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"redfish\"\naddress = \"https://10.0.0.5/\"\nsystem = \"{system}\"\nusername = \"u\"\npassword_file = \"{}\"\n",
            pw.display()
        )
    };
    let ok = format!(
        "datacenter = \"dc1\"\n{}{}",
        entry("n1", "/redfish/v1/Systems/1"),
        entry("n2", "/redfish/v1/Systems/2")
    );
    assert!(parse(&ok).is_ok());
    let dup = format!(
        "datacenter = \"dc1\"\n{}{}",
        entry("n1", "/redfish/v1/Systems/1"),
        entry("n2", "/redfish/v1/Systems/1/")
    );
    let e = parse(&dup).unwrap_err().to_string();
    assert!(
        e.contains("dc1.toml:12: [[bmc]] #2 address: ")
            && e.contains("same machine as [[bmc]] #1 (line 2)"),
        "{e}"
    );
}

/// Two spellings of one BMC are one machine: the default port written out or not, a
/// trailing slash, the host's case.
#[test]
fn two_spellings_of_one_bmc_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let redfish = |node: &str, address: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"redfish\"\naddress = \"{address}\"\nsystem = \"/redfish/v1/Systems/1\"\nusername = \"u\"\npassword_file = \"{}\"\n",
            pw.display()
        )
    };
    for (a, b) in [
        ("https://bmc1.example/", "https://bmc1.example:443"),
        ("https://BMC1.example", "https://bmc1.example/"),
        ("https://10.0.0.5:443/", "https://10.0.0.5"),
    ] {
        let dup = format!(
            "datacenter = \"dc1\"\n{}{}",
            redfish("n1", a),
            redfish("n2", b)
        );
        let e = parse(&dup).unwrap_err().to_string();
        assert!(
            e.contains("same machine as [[bmc]] #1 (line 2)"),
            "{a} vs {b}: {e}"
        );
    }
    let other_port = format!(
        "datacenter = \"dc1\"\n{}{}",
        redfish("n1", "https://bmc1.example"),
        redfish("n2", "https://bmc1.example:8443")
    );
    assert!(parse(&other_port).is_ok());
    // A proxy's path prefix is part of the BMC: two prefixes, two machines; one prefix
    // spelt with and without its trailing slash, one machine.
    let two_prefixes = format!(
        "datacenter = \"dc1\"\n{}{}",
        redfish("n1", "https://proxy.example/bmc1/"),
        redfish("n2", "https://proxy.example/bmc2/")
    );
    assert!(parse(&two_prefixes).is_ok());
    let one_prefix = format!(
        "datacenter = \"dc1\"\n{}{}",
        redfish("n1", "https://proxy.example/bmc1/"),
        redfish("n2", "https://proxy.example:443/bmc1")
    );
    let e = parse(&one_prefix).unwrap_err().to_string();
    assert!(e.contains("same machine as [[bmc]] #1"), "{e}");
    let ipmi = |node: &str, address: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"ipmi\"\naddress = \"{address}\"\nusername = \"u\"\npassword_file = \"{}\"\n",
            pw.display()
        )
    };
    let dup = format!(
        "datacenter = \"dc1\"\n{}{}",
        ipmi("n1", "IPMI1.example"),
        ipmi("n2", "ipmi1.example:623")
    );
    let e = parse(&dup).unwrap_err().to_string();
    assert!(e.contains("same machine as [[bmc]] #1"), "{e}");
}

#[test]
fn identity_defaults_to_checked_and_can_be_unchecked() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let cfg = parse(&minimal(&pw)).unwrap();
    assert_eq!(cfg.bmc[0].identity, IdentityCheck::Checked);
    let text = minimal(&pw) + "identity = \"unchecked\"\n";
    assert_eq!(
        parse(&text).unwrap().bmc[0].identity,
        IdentityCheck::Unchecked
    );
    let e = parse(&(minimal(&pw) + "identity = \"off\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bmc") && e.contains("identity"), "{e}");
}

/// `auth` takes basic, session or auto (the default) on Redfish entries only; an address path
/// is a prefix, never Redfish's own path.
#[test]
fn redfish_auth_and_address_paths() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let auth = |extra: &str| {
        parse(&format!("{}{extra}", minimal(&pw))).map(|c| c.bmc[0].redfish.unwrap().auth)
    };
    assert_eq!(auth("").unwrap(), RedfishAuth::Auto);
    assert_eq!(auth("auth = \"session\"\n").unwrap(), RedfishAuth::Session);
    assert_eq!(auth("auth = \"basic\"\n").unwrap(), RedfishAuth::Basic);
    let e = auth("auth = \"token\"\n").unwrap_err().to_string();
    assert!(
        e.contains("dc1.toml:9: [[bmc]] #1 auth: ") && e.contains("\"session\""),
        "{e}"
    );
    let ipmi = minimal(&pw)
        .replace("\"redfish\"", "\"ipmi\"")
        .replace("https://{node}-bmc.dc1.example", "{node}-ipmi.dc1.example");
    let e = parse(&format!("{ipmi}auth = \"session\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dc1.toml:9: [[bmc]] #1 auth: ") && e.contains("redfish"),
        "{e}"
    );
    assert_eq!(parse(&ipmi).unwrap().bmc[0].redfish, None);

    let with_address =
        |address: &str| parse(&minimal(&pw).replace("https://{node}-bmc.dc1.example", address));
    assert!(with_address("https://proxy.dc1.example/{node}/").is_ok());
    for bad in [
        "https://{node}-bmc.dc1.example/redfish/v1",
        "https://{node}-bmc.dc1.example/redfish/v1/",
    ] {
        let e = with_address(bad).unwrap_err().to_string();
        assert!(
            e.contains("[[bmc]] #1 address: ") && e.contains("without /redfish/v1"),
            "{bad}: {e}"
        );
    }
}
