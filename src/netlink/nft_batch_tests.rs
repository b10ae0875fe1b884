use super::*;

#[test]
fn frames_a_batch_with_acks_and_lengths() {
    let mut tx = Transaction::new();
    // NFT_MSG_NEWTABLE with NLM_F_CREATE, AF_INET, table "nat".
    tx.push(
        0,
        0x400,
        2,
        &[name_attr(1, "nat")],
        "create table nat".into(),
    )
    .unwrap();
    let buf = tx.framed();
    assert_eq!(buf.len(), 20 + 28 + 20);
    // BATCH_BEGIN: seq 1, res_id = nftables (big-endian 10).
    assert_eq!(&buf[4..6], &NFNL_MSG_BATCH_BEGIN.to_ne_bytes());
    assert_eq!(&buf[8..12], &1u32.to_ne_bytes());
    assert_eq!(&buf[18..20], &[0, 10]);
    // NEWTABLE (the last message, so it asks for the ACK): length 28, type 10<<8,
    // REQUEST|ACK|CREATE, seq 2, AF_INET.
    assert_eq!(&buf[20..24], &28u32.to_ne_bytes());
    assert_eq!(&buf[24..26], &(10u16 << 8).to_ne_bytes());
    assert_eq!(&buf[26..28], &(0x1u16 | 0x4 | 0x400).to_ne_bytes());
    assert_eq!(&buf[28..32], &2u32.to_ne_bytes());
    assert_eq!(buf[36], 2);
    assert_eq!(&buf[40..48], &[8, 0, 1, 0, b'n', b'a', b't', 0]);
    assert_eq!(&buf[52..54], &NFNL_MSG_BATCH_END.to_ne_bytes());
    assert_eq!(&buf[56..60], &3u32.to_ne_bytes());
}

#[test]
fn only_the_last_message_asks_for_the_ack() {
    let mut tx = Transaction::new();
    for name in ["a", "b"] {
        tx.push(0, 0, 2, &[name_attr(1, name)], name.into())
            .unwrap();
    }
    let buf = tx.framed();
    let flags = |at: usize| u16::from_ne_bytes([buf[at + 6], buf[at + 7]]);
    assert_eq!(flags(20) & NLM_F_ACK, 0);
    assert_eq!(flags(20 + 28) & NLM_F_ACK, NLM_F_ACK);
}

#[test]
fn an_attribute_too_long_for_its_length_field_is_refused() {
    let mut tx = Transaction::new();
    let huge = DefaultNla::new(3, vec![0; 65532]);
    let err = tx
        .push(3, 0, 2, &[huge], "create chain nat/X".into())
        .unwrap_err();
    assert!(
        matches!(
            err,
            BatchError::AttrTooLong {
                kind: 3,
                len: 65536,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("create chain nat/X"), "{err}");
    assert!(tx.is_empty(), "nothing of a refused message is framed");
}

#[test]
fn answers_survive_the_trip_through_one_word() {
    for answer in [
        Answer::Committed,
        Answer::Rejected {
            seq: 4_000_000,
            errno: libc::EINVAL,
        },
        Answer::Unanswered,
        Answer::Io { errno: libc::EPERM },
        Answer::Malformed,
    ] {
        assert_eq!(Answer::from_word(answer.to_word()), answer);
    }
}

#[test]
fn replies_decide_on_the_first_error_or_the_last_ack() {
    let reply = |seq: u32, code: i32| {
        let mut m = Vec::new();
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&code.to_ne_bytes());
        m.extend_from_slice(&[0; 16]);
        m
    };
    assert_eq!(scan_replies(&reply(3, 0), 3), Some(Answer::Committed));
    assert_eq!(scan_replies(&reply(2, 0), 3), None);
    assert_eq!(
        scan_replies(&reply(2, -libc::EINVAL), 3),
        Some(Answer::Rejected {
            seq: 2,
            errno: libc::EINVAL
        })
    );
    assert_eq!(scan_replies(&reply(3, 0)[..20], 3), Some(Answer::Malformed));
    // An answer to a sequence number this transaction never sent.
    assert_eq!(scan_replies(&reply(9, 0), 3), Some(Answer::Malformed));
}
