/* data: (to be written) */
