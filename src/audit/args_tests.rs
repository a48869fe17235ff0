use super::*;

fn strings(v: &[OsString]) -> Vec<String> {
    v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
}

#[test]
fn audit_flags_are_taken_out_and_the_sidecar_flags_kept_in_order() {
    let argv = [
        "-csi-address=/run/csi/socket",
        "-o",
        "json",
        "--min-age=30s",
        "--v=5",
        "-delete-orphans",
        "--confirm=false",
        "--kubeconfig",
        "/k",
    ]
    .map(OsString::from);
    let (audit, sidecar) = split(argv);
    assert_eq!(
        strings(&audit),
        ["-o", "json", "--min-age", "30s", "--delete-orphans"]
    );
    assert_eq!(
        strings(&sidecar),
        [
            "-csi-address=/run/csi/socket",
            "--v=5",
            "--kubeconfig",
            "/k"
        ]
    );
    let parsed = AuditArgs::try_parse_from(audit).unwrap();
    assert_eq!(parsed.output, Output::Json);
    assert_eq!(parsed.min_age, Duration::from_secs(30));
    assert!(parsed.delete_orphans && !parsed.confirm);
}

#[test]
fn defaults_wait_two_minutes_and_print_a_table() {
    let parsed = AuditArgs::try_parse_from(Vec::<OsString>::new()).unwrap();
    assert_eq!(parsed.output, Output::Table);
    assert_eq!(parsed.min_age, Duration::from_secs(120));
    assert!(!parsed.delete_orphans && !parsed.confirm);
    let bad = AuditArgs::try_parse_from(["-o", "xml"]).unwrap_err();
    assert!(bad.to_string().contains("table"), "{bad}");
}
