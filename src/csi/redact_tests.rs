use super::*;
use std::collections::BTreeSet;

#[test]
fn secret_values_and_keys_never_reach_the_output() {
    let request = v1::CreateVolumeRequest {
        name: "pvc-1234".into(),
        parameters: HashMap::from([("type".into(), "gp3".into())]),
        secrets: HashMap::from([("admin-password".into(), "hunter2-s3cr3t".into())]),
        ..Default::default()
    };
    let text = redacted(&request).to_string();
    assert!(!text.contains("hunter2-s3cr3t"), "{text}");
    assert!(!text.contains("admin-password"), "{text}");
    assert!(text.contains(STRIPPED), "{text}");
    // Everything else stays readable, and the original is untouched.
    assert!(text.contains("pvc-1234") && text.contains("gp3"), "{text}");
    assert_eq!(request.secrets["admin-password"], "hunter2-s3cr3t");
}

#[test]
fn a_huge_message_is_cut_to_a_bounded_log_line_that_says_how_big_it_was() {
    let response = v1::CreateVolumeResponse {
        volume: Some(v1::Volume {
            volume_id: "vol-1\n\u{1b}[31mFAKE".into(),
            volume_context: HashMap::from([("blob".into(), "é".repeat(1 << 20))]),
            ..Default::default()
        }),
    };
    let text = redacted(&response).to_string();
    assert!(text.len() < LOG_LIMIT + 64, "{} bytes", text.len());
    assert!(
        text.ends_with(" bytes in all)"),
        "{}",
        &text[text.len() - 40..]
    );
    // Debug escapes control characters: a driver cannot forge log lines.
    assert!(!text.contains('\n') && !text.contains('\u{1b}'));
}

#[test]
fn messages_without_secrets_print_in_full() {
    let response = v1::NodeGetInfoResponse {
        node_id: "node-a".into(),
        ..Default::default()
    };
    assert_eq!(redacted(&response).to_string(), format!("{response:?}"));
    let empty = v1::DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        ..Default::default()
    };
    assert!(!redacted(&empty).to_string().contains(STRIPPED));
}

/// Reads the spec's own `csi_secret` markers from proto/csi.proto, so a secret field added to the
/// spec cannot go unstripped here.
#[test]
fn strips_exactly_the_fields_the_spec_marks_csi_secret() {
    use protox::prost_reflect::{DescriptorPool, Kind, MessageDescriptor};

    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    let mut compiler = protox::Compiler::new([proto_dir]).unwrap();
    compiler.open_file("csi.proto").unwrap();
    let pool: DescriptorPool = compiler.descriptor_pool();
    let csi_secret = pool.get_extension_by_name("csi.v1.csi_secret").unwrap();

    let is_secret = |field: &protox::prost_reflect::FieldDescriptor| {
        let options = field.options();
        options.has_extension(&csi_secret)
            && options.get_extension(&csi_secret).as_bool() == Some(true)
    };

    let csi_messages: Vec<MessageDescriptor> = pool
        .all_messages()
        .filter(|m| m.package_name() == "csi.v1")
        .collect();
    let marked: BTreeSet<String> = csi_messages
        .iter()
        .flat_map(|m| {
            m.fields()
                .filter(is_secret)
                .map(|f| f.full_name().to_owned())
        })
        .collect();
    let stripped: BTreeSet<String> = SECRET_FIELDS.iter().map(|s| (*s).to_owned()).collect();
    assert!(
        !marked.is_empty(),
        "no csi_secret field found: were the options parsed?"
    );
    assert_eq!(
        marked, stripped,
        "redact.rs must strip exactly the csi_secret fields"
    );

    // Stripping is per top-level message: no message may carry secrets inside a sub-message.
    for message in &csi_messages {
        for field in message.fields() {
            if let Kind::Message(inner) = field.kind() {
                assert!(
                    !inner.fields().any(|f| is_secret(&f)),
                    "{} nests secrets in {}: extend redact.rs",
                    field.full_name(),
                    inner.full_name()
                );
            }
        }
    }
}
